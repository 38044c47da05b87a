/* offgraph bench: prefill and decode speed of a program on random tokens,
 * and what the KV storage costs against what the tokens need. */
#include "cli.h"
#include "commands.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: offgraph bench -m <program> [options]\n\n"
            "Prefills a random prompt in every session, then decodes greedily, stepping the\n"
            "sessions in turn; prints tokens per second for each phase and the KV bytes\n"
            "allocated against the bytes the tokens occupy.\n\n"
            "  --prompt <N>             prompt tokens per session (default 128)\n"
            "  --gen <N>                generated tokens per session (default 32)\n"
            "  --sessions <K>           sessions on the one model (default 1)\n"
            "  --seed <N>               random prompt seed (default 1)\n"
            "  --json                   one line of JSON instead of the table\n");
    og_cli_model_opts_usage(f);
}

int og_cmd_bench(int argc, char **argv) {
    int64_t prompt = 128, gen = 32, sessions = 1, seed = 1;
    bool json = false;
    og_cli_model_opts mo;
    og_cli_model_opts_default(&mo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = og_cli_model_option("bench", argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--prompt")) {
            if (!(v = og_cli_value("bench", argc, argv, &i)) || !og_cli_int("bench", a, v, 1, INT32_MAX, &prompt)) return 2;
        } else if (!strcmp(a, "--gen")) {
            if (!(v = og_cli_value("bench", argc, argv, &i)) || !og_cli_int("bench", a, v, 0, INT32_MAX, &gen)) return 2;
        } else if (!strcmp(a, "--sessions")) {
            if (!(v = og_cli_value("bench", argc, argv, &i)) || !og_cli_int("bench", a, v, 1, 4096, &sessions)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = og_cli_value("bench", argc, argv, &i)) || !og_cli_int("bench", a, v, 0, INT32_MAX, &seed)) return 2;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else {
            fprintf(stderr, "offgraph bench: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!mo.model) {
        fprintf(stderr, "offgraph bench: -m <program> is required\n");
        usage(stderr);
        return 2;
    }
    int rc = 1;
    og_model *m = og_cli_load_model("bench", mo.model, mo.backend, mo.threads);
    if (!m) return 1;
    const int64_t V = og_model_vocab_size(m);
    og_session **ss = calloc((size_t)sessions, sizeof *ss);
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    int32_t *next = calloc((size_t)sessions, sizeof *next);
    if (!ss || !ids || !next) {
        fprintf(stderr, "offgraph bench: no memory\n");
        goto done;
    }
    uint64_t r = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    double t_prefill = 0, t_decode = 0;
    for (int64_t k = 0; k < sessions; k++) {
        og_status st = og_session_create(m, &mo.session, &ss[k]);
        if (st != OG_OK) {
            fprintf(stderr, "offgraph bench: session %lld: %s\n", (long long)k, og_last_error());
            goto done;
        }
        for (int64_t t = 0; t < prompt; t++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            ids[t] = (int32_t)(r % (uint64_t)V);
        }
        double t0 = og_time_now();
        st = og_session_eval_next(ss[k], ids, prompt, 0, &next[k]);
        t_prefill += og_time_now() - t0;
        if (st != OG_OK) {
            fprintf(stderr, "offgraph bench: prefill of session %lld: %s\n", (long long)k, og_session_last_error(ss[k]));
            goto done;
        }
    }
    for (int64_t g = 0; g < gen; g++) {
        for (int64_t k = 0; k < sessions; k++) {
            double t0 = og_time_now();
            og_status st = og_session_eval_next(ss[k], &next[k], 1, 0, &next[k]);
            t_decode += og_time_now() - t0;
            if (st != OG_OK) {
                fprintf(stderr, "offgraph bench: decode of session %lld at token %lld: %s\n", (long long)k,
                        (long long)g, og_session_last_error(ss[k]));
                goto done;
            }
        }
    }
    og_kv_metrics tot = {0};
    for (int64_t k = 0; k < sessions; k++) {
        og_kv_metrics mk;
        og_session_metrics(ss[k], &mk);
        tot.bytes_allocated += mk.bytes_allocated;
        tot.bytes_live += mk.bytes_live;
        tot.growth_count += mk.growth_count;
        tot.length += mk.length;
    }
    double pf = (double)(prompt * sessions) / t_prefill;
    double dc = gen ? (double)(gen * sessions) / t_decode : 0;
    if (json) {
        printf("{\"prompt\":%lld,\"gen\":%lld,\"sessions\":%lld,\"prefill_tokens_per_s\":%.2f,"
               "\"decode_tokens_per_s\":%.2f,\"kv_bytes_allocated\":%lld,\"kv_bytes_live\":%lld,"
               "\"growth_events\":%lld}\n",
               (long long)prompt, (long long)gen, (long long)sessions, pf, dc, (long long)tot.bytes_allocated,
               (long long)tot.bytes_live, (long long)tot.growth_count);
    } else {
        printf("sessions %lld, prompt %lld, generated %lld tokens each\n", (long long)sessions, (long long)prompt,
               (long long)gen);
        printf("  prefill          %10.1f tokens/s\n", pf);
        printf("  decode           %10.1f tokens/s\n", dc);
        printf("  KV allocated     %10.2f MiB\n", (double)tot.bytes_allocated / 1048576.0);
        printf("  KV live          %10.2f MiB\n", (double)tot.bytes_live / 1048576.0);
        printf("  growth events    %10lld\n", (long long)tot.growth_count);
    }
    rc = 0;
done:
    if (ss)
        for (int64_t k = 0; k < sessions; k++) og_session_destroy(ss[k]);
    free(ss);
    free(ids);
    free(next);
    og_model_free(m);
    return rc;
}
