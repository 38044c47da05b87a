/* offgraph bench: prefill and decode speed of a program on random tokens for
 * K sessions stepped together (og_model_step) or one after another, and what
 * the KV storage costs against what the tokens need. */
#include "cli.h"
#include "commands.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: offgraph bench -m <model> [options]\n\n"
            "Prefills a random prompt in each of K sessions, then decodes greedily. By default\n"
            "the sessions step together (og_model_step): the prefill packs prompt chunks of\n"
            "several sessions into steps of at most --rows rows (each chunk at most the\n"
            "program's max_write tokens), and each decode step advances all K sessions by one\n"
            "token. An untimed prefill of the same prompts in throwaway sessions runs first\n"
            "(what a process pays once: loading kernels, the libraries' first calls, step\n"
            "scratch), and one untimed decode step (on CUDA it captures the graph of the\n"
            "batch's bucket); the timed sessions are fresh, so their prefill grows their KV\n"
            "storage as any new conversation's does. Prints prefill tokens/s, aggregate decode tokens/s (K x gen over\n"
            "the decode time) and per session, the KV bytes allocated against the bytes the\n"
            "tokens occupy (summed over sessions), and the graph captures of each bucket\n"
            "(bucket b holds up to 2^b sessions; more than 1 capture in a bucket is a re-capture).\n\n"
            "  --prompt <N>             prompt tokens per session (default 128)\n"
            "  --gen <N>                timed decode tokens per session (default 32)\n"
            "  --sessions <K>           K requests of the library's engine (og_engine: its\n"
            "                           scheduler batches them; no prefix cache), which is what\n"
            "                           run, serve and the Python binding generate through:\n"
            "                           a round of K prompts (prefill), then a round of K\n"
            "                           decodes going on in the same sessions; without it one\n"
            "                           session on the direct step path\n"
            "  --direct                 with --sessions: the K sessions on the direct step path\n"
            "                           (og_model_step, as described above), for comparison\n"
            "  --rows <N>               most rows in one prefill step (default 2048; -b too)\n"
            "  --sequential             step the sessions one after another instead\n"
            "                           (og_session_eval_next per session), for comparison\n"
            "  --seed <N>               random prompt seed (default 1)\n"
            "  --no-warmup              time the first prefill of the process (a cold start)\n"
            "  --json                   one line of JSON instead of the table\n");
    og_cli_model_opts_usage(f);
}

typedef struct bench {
    og_model *m;
    og_session **ss;
    int64_t K, prompt, rows;
    int32_t *ids;          /* [K, prompt] */
    int32_t *next;         /* [K]: each session's next input token */
    og_batch_item *items;  /* [K] */
    int64_t *who;          /* [K]: the session of each item */
    int64_t *fed;          /* [K]: prompt tokens each session has taken */
    double in_step;        /* seconds inside og_model_step, summed */
    og_model_metrics phases0, phases1; /* the model's figures before and after the timed decode */
} bench;

/* The timed decode's mean milliseconds a step in each phase of
 * og_model_metrics (steps: how many; 0 when there were none). */
typedef struct phase_ms {
    int64_t steps;
    double prepare, submit, wait, finish;
} phase_ms;

static phase_ms phases_of(const og_model_metrics *a, const og_model_metrics *b) {
    const int64_t n = b->steps - a->steps;
    if (n <= 0) return (phase_ms){0};
    const double k = 1e3 / (double)n;
    return (phase_ms){.steps = n,
                      .prepare = k * (b->prepare_seconds - a->prepare_seconds),
                      .submit = k * (b->submit_seconds - a->submit_seconds),
                      .wait = k * (b->wait_seconds - a->wait_seconds),
                      .finish = k * (b->finish_seconds - a->finish_seconds)};
}

static bool step(bench *b, int32_t n, const char *phase) {
    const double t_in = og_time_now();
    const og_status st = og_model_step(b->m, b->items, n);
    b->in_step += og_time_now() - t_in;
    if (st == OG_OK) {
        for (int32_t i = 0; i < n; i++)
            if (b->items[i].output == OG_OUTPUT_ARGMAX) b->next[b->who[i]] = b->items[i].token;
        return true;
    }
    fprintf(stderr, "offgraph bench: %s step of %d sessions: %s\n", phase, n, og_last_error());
    return false;
}

/* Every step takes the next chunk (at most max_write tokens) of each session's
 * prompt in turn while the step has rows left (at most b->rows); a session's
 * last chunk yields its first generated token. */
static bool prefill_batched(bench *b) {
    const int64_t max_write = og_model_kv_config(b->m)->max_write;
    for (int64_t first = 0; first < b->K;) {
        int32_t n = 0;
        for (int64_t k = first, budget = b->rows; k < b->K && budget > 0; k++) {
            int64_t c = b->prompt - b->fed[k];
            c = c < max_write ? c : max_write;
            c = c < budget ? c : budget;
            budget -= c;
            b->who[n] = k;
            b->items[n++] = (og_batch_item){.session = b->ss[k], .tokens = b->ids + k * b->prompt + b->fed[k],
                                            .n_tokens = (int32_t)c,
                                            .output = b->fed[k] + c == b->prompt ? OG_OUTPUT_ARGMAX : OG_OUTPUT_NONE};
            b->fed[k] += c;
        }
        if (!step(b, n, "prefill")) return false;
        while (first < b->K && b->fed[first] == b->prompt) first++;
    }
    return true;
}

/* One token for every session, in one step. */
static bool decode_batched(bench *b) {
    for (int64_t k = 0; k < b->K; k++) {
        b->who[k] = k;
        b->items[k] = (og_batch_item){.session = b->ss[k], .tokens = &b->next[k], .n_tokens = 1,
                                      .output = OG_OUTPUT_ARGMAX};
    }
    return step(b, (int32_t)b->K, "decode");
}

/* The prompt (phase 0) or one token (phase 1) of every session in turn. */
static bool run_sequential(bench *b, int phase) {
    for (int64_t k = 0; k < b->K; k++) {
        og_status st = phase == 0 ? og_session_eval_next(b->ss[k], b->ids + k * b->prompt, b->prompt, 0, &b->next[k])
                                  : og_session_eval_next(b->ss[k], &b->next[k], 1, 0, &b->next[k]);
        if (st != OG_OK) {
            fprintf(stderr, "offgraph bench: %s of session %lld: %s\n", phase == 0 ? "prefill" : "decode",
                    (long long)k, og_session_last_error(b->ss[k]));
            return false;
        }
    }
    return true;
}

/* One round of K (<= b->K) requests through the library's engine (og_engine), each
 * going on in its session b->ss[k]: session k's n_ids token ids at ids +
 * k * n_ids, max_tokens each (ignore_eos: every one is generated),
 * submitted together; *fin gets each request's final output. */
static bool engine_round(bench *b, og_engine *e, int64_t K, const int32_t *ids, int64_t n_ids, int64_t max_tokens,
                         og_request_output *fin) {
    og_request **rs = calloc((size_t)K, sizeof *rs);
    bool ok = rs != NULL;
    for (int64_t k = 0; ok && k < K; k++) {
        og_request_params p = og_request_default_params();
        p.kind = OG_PROMPT_TOKENS;
        p.tokens = ids + k * n_ids;
        p.n_tokens = n_ids;
        p.sampling.temperature = 0; /* greedy, as the direct path's arg-max */
        p.max_tokens = max_tokens;
        p.ignore_eos = true;
        p.session = b->ss[k];
        if (og_engine_submit(e, &p, &rs[k]) != OG_OK) {
            fprintf(stderr, "offgraph bench: request %lld: %s\n", (long long)k, og_last_error());
            ok = false;
        }
    }
    /* only the ends are wanted (the engine times them): looked for every
     * 20 ms, so that no token wakes this thread beside the scheduler's */
    for (int64_t k = 0; k < K; k++) {
        while (rs && rs[k] && (og_request_next(rs[k], &fin[k], 0), fin[k].finish == OG_FINISH_NONE))
            nanosleep(&(struct timespec){0, 20000000}, NULL);
        if (ok && fin[k].finish != OG_FINISH_LENGTH) {
            fprintf(stderr, "offgraph bench: request %lld ended early: %s\n", (long long)k,
                    fin[k].finish == OG_FINISH_ERROR ? fin[k].error : "cancelled");
            ok = false;
        }
    }
    if (rs)
        for (int64_t k = 0; k < K; k++) og_request_destroy(rs[k]); /* gives session k back */
    free(rs);
    return ok;
}

/* The time from the first submit of a round to its last token given out,
 * and the tokens it generated. A request in a caller's session ends a step
 * after its last token (the engine feeds that token to the session, which
 * the direct path leaves unfed); that step delays no token, so it is not
 * timed. */
static double round_time(const bench *b, const og_request_output *fin, int64_t *generated) {
    double t0 = fin[0].t_submit, t1 = fin[0].t_last_token;
    *generated = 0;
    for (int64_t k = 0; k < b->K; k++) {
        if (fin[k].t_submit < t0) t0 = fin[k].t_submit;
        if (fin[k].t_last_token > t1) t1 = fin[k].t_last_token;
        *generated += fin[k].completion_tokens;
    }
    return t1 - t0 > 0 ? t1 - t0 : 1e-9;
}

static void print_buckets(const int64_t *v) {
    for (int i = 0; i < OG_BATCH_BUCKETS; i++) printf("%s%lld", i ? "," : "", (long long)v[i]);
}

/* An engine figure by name from its metrics text (0 when absent). */
static double engine_figure(og_engine *e, const char *name) {
    char *text = og_engine_metrics_text(e), key[96];
    snprintf(key, sizeof key, "\noffgraph_%s ", name);
    const char *at = text ? strstr(text, key) : NULL;
    const double v = at ? strtod(at + strlen(key), NULL) : 0;
    og_free(text);
    return v;
}

/* bench --sessions K: K requests of the engine stepped by its scheduler
 * (continuous batching, rows under --rows, chunks of max_write; no prefix
 * cache, so every prompt is read), in two rounds over the same K sessions
 * (requests that go on in a session the caller owns, as a conversation's
 * turns do):
 *   prefill: each request reads its prompt and draws one token (fed to its
 *     session as the engine feeds every token given out); rate: the prompt
 *     tokens over the time from the first submit to the last token drawn,
 *     as the direct path times its prompt steps;
 *   decode: each request reads one more token and generates gen; rate: the
 *     generated tokens over the time from the first submit to the last token
 *     given out (the one-token prompts are read by the first step, which
 *     draws the first token: gen steps for gen tokens, as the direct path's
 *     timed steps; the step after, which feeds the last token to the
 *     session, gives out nothing and is not timed: round_time).
 * Splitting the rounds keeps prompt steps out of the decode time, as on the
 * direct path (one round of both would time the decode of early requests
 * beside the later ones' prompts). An untimed pass of both rounds (two
 * tokens) on other sessions comes first unless --no-warmup, its decode round
 * also run by 1, 2, 4, ... requests (below). *step_ms and *gap_ms: the
 * timed decode round's mean time a step inside og_model_step and between
 * steps (the engine's step_seconds_total and step_gap_seconds_total). */
static bool bench_engine(bench *b, const og_cli_model_opts *mo, int64_t gen, bool warmup, double *pf, double *dc,
                         double *t_decode, og_kv_metrics *tot, double *step_ms, double *gap_ms) {
    og_engine_params ep = og_engine_default_params();
    ep.session = mo->session;
    ep.max_sessions = (int32_t)b->K;
    ep.prefix_cache_bytes = 0;
    ep.chunk = og_model_kv_config(b->m)->max_write;
    ep.step_rows = (int32_t)(b->rows < INT32_MAX ? b->rows : INT32_MAX);
    og_engine *e = NULL;
    if (og_engine_create(b->m, NULL, &ep, &e) != OG_OK) {
        fprintf(stderr, "offgraph bench: %s\n", og_last_error());
        return false;
    }
    og_request_output *fin = calloc((size_t)b->K, sizeof *fin);
    int32_t *one = malloc((size_t)b->K * sizeof *one); /* each session's one-token prompt of the decode round */
    bool ok = fin && one;
    if (!ok) fprintf(stderr, "offgraph bench: no memory\n");
    for (int64_t k = 0; ok && k < b->K; k++) one[k] = b->ids[k * b->prompt];
    for (int pass = warmup ? 0 : 1; ok && pass < 2; pass++) { /* pass 0: the untimed warm-up */
        for (int64_t k = 0; ok && k < b->K; k++) {
            og_session_destroy(b->ss[k]);
            b->ss[k] = NULL;
            if (og_session_create(b->m, &mo->session, &b->ss[k]) != OG_OK) {
                fprintf(stderr, "offgraph bench: session %lld: %s\n", (long long)k, og_last_error());
                ok = false;
            }
        }
        int64_t generated = 0;
        ok = ok && engine_round(b, e, b->K, b->ids, b->prompt, 1, fin);
        if (ok && pass == 1) *pf = (double)(b->prompt * b->K) / round_time(b, fin, &generated);
        /* the warm-up decodes 1, 2, 4, ... and K requests at once: requests
         * that reach the scheduler across steps make decode steps of fewer
         * rows, whose graphs (one per bucket of 2^b rows on CUDA) are then
         * captured here, once a process, as the direct path's warm-up
         * captures its one bucket */
        for (int64_t w = 1; ok && pass == 0 && w < b->K; w *= 2) ok = engine_round(b, e, w, one, 1, 2, fin);
        const int64_t n = pass == 0 ? 2 : gen;
        if (!ok || n == 0) continue;
        const double s0 = engine_figure(e, "step_seconds_total"), g0 = engine_figure(e, "step_gap_seconds_total"),
                     n0 = engine_figure(e, "steps_total");
        og_model_metrics_get(b->m, &b->phases0);
        ok = engine_round(b, e, b->K, one, 1, n, fin);
        og_model_metrics_get(b->m, &b->phases1);
        if (ok && pass == 1) {
            *t_decode = round_time(b, fin, &generated);
            *dc = (double)generated / *t_decode;
            const double steps = engine_figure(e, "steps_total") - n0;
            *step_ms = steps > 0 ? 1e3 * (engine_figure(e, "step_seconds_total") - s0) / steps : 0;
            *gap_ms = steps > 0 ? 1e3 * (engine_figure(e, "step_gap_seconds_total") - g0) / steps : 0;
        }
    }
    for (int64_t k = 0; ok && k < b->K; k++) {
        og_kv_metrics mk;
        og_session_metrics(b->ss[k], &mk);
        tot->bytes_allocated += mk.bytes_allocated;
        tot->bytes_live += mk.bytes_live;
        tot->growth_count += mk.growth_count;
        tot->graph_captures += mk.graph_captures;
    }
    free(one);
    free(fin);
    og_engine_destroy(e);
    return ok;
}

int og_cmd_bench(int argc, char **argv) {
    int64_t prompt = 128, gen = 32, sessions = 1, seed = 1, rows = 2048;
    bool json = false, sequential = false, warmup = true, engine = false, direct = false;
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
            engine = true;
        } else if (!strcmp(a, "--rows")) {
            if (!(v = og_cli_value("bench", argc, argv, &i)) || !og_cli_int("bench", a, v, 1, INT32_MAX, &rows)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = og_cli_value("bench", argc, argv, &i)) || !og_cli_int("bench", a, v, 0, INT32_MAX, &seed)) return 2;
        } else if (!strcmp(a, "--sequential")) {
            sequential = true;
        } else if (!strcmp(a, "--direct")) {
            direct = true;
        } else if (!strcmp(a, "--no-warmup")) {
            warmup = false;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else {
            fprintf(stderr, "offgraph bench: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (mo.batch) rows = mo.batch; /* llama.cpp's -b: the rows of one step */
    if (!mo.model) {
        fprintf(stderr, "offgraph bench: -m <program> is required\n");
        usage(stderr);
        return 2;
    }
    int rc = 1;
    bench b = {.K = sessions, .prompt = prompt, .rows = rows};
    if (!(b.m = og_cli_load_model("bench", mo.model, mo.backend, mo.threads))) return 1;
    const int64_t V = og_model_vocab_size(b.m);
    b.ss = calloc((size_t)sessions, sizeof *b.ss);
    b.ids = malloc((size_t)(prompt * sessions) * sizeof *b.ids);
    b.next = calloc((size_t)sessions, sizeof *b.next);
    b.items = calloc((size_t)sessions, sizeof *b.items);
    b.who = calloc((size_t)sessions, sizeof *b.who);
    b.fed = calloc((size_t)sessions, sizeof *b.fed);
    if (!b.ss || !b.ids || !b.next || !b.items || !b.who || !b.fed) {
        fprintf(stderr, "offgraph bench: no memory\n");
        goto done;
    }
    uint64_t r = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t t = 0; t < prompt * sessions; t++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        b.ids[t] = (int32_t)(r % (uint64_t)V);
    }
    double pf = 0, dc = 0, t_decode = 0, step_ms = -1, gap_ms = -1;
    og_kv_metrics tot = {0};
    const char *mode = sequential ? "sequential" : "batched";
    if (engine && !sequential && !direct) {
        if (!bench_engine(&b, &mo, gen, warmup, &pf, &dc, &t_decode, &tot, &step_ms, &gap_ms)) goto done;
        mode = "engine";
        goto report;
    }
    for (int pass = warmup ? 0 : 1; pass < 2; pass++) { /* pass 0: the untimed warm-up */
        for (int64_t k = 0; k < sessions; k++) {
            og_session_destroy(b.ss[k]);
            b.ss[k] = NULL;
            b.fed[k] = 0;
        }
        for (int64_t k = 0; k < sessions; k++)
            if (og_session_create(b.m, &mo.session, &b.ss[k]) != OG_OK) {
                fprintf(stderr, "offgraph bench: session %lld: %s\n", (long long)k, og_last_error());
                goto done;
            }
        if (pass == 0 && !(sequential ? run_sequential(&b, 0) : prefill_batched(&b))) goto done;
    }
    double t0 = og_time_now();
    if (!(sequential ? run_sequential(&b, 0) : prefill_batched(&b))) goto done;
    const double t_prefill = og_time_now() - t0;
    if (gen > 0 && !(sequential ? run_sequential(&b, 1) : decode_batched(&b))) goto done; /* untimed */
    t0 = og_time_now();
    b.in_step = 0;
    og_model_metrics_get(b.m, &b.phases0);
    for (int64_t g = 0; g < gen; g++)
        if (!(sequential ? run_sequential(&b, 1) : decode_batched(&b))) goto done;
    t_decode = og_time_now() - t0;
    og_model_metrics_get(b.m, &b.phases1);
    if (!sequential && gen > 0) { /* as the engine's figures: inside og_model_step, and the rest */
        step_ms = 1e3 * b.in_step / (double)gen;
        gap_ms = 1e3 * (t_decode - b.in_step) / (double)gen;
    }

    for (int64_t k = 0; k < sessions; k++) {
        og_kv_metrics mk;
        og_session_metrics(b.ss[k], &mk);
        tot.bytes_allocated += mk.bytes_allocated;
        tot.bytes_live += mk.bytes_live;
        tot.growth_count += mk.growth_count;
        tot.graph_captures += mk.graph_captures;
    }
    pf = (double)(prompt * sessions) / t_prefill;
    dc = gen ? (double)(gen * sessions) / t_decode : 0;
report:;
    og_model_metrics mm;
    og_model_metrics_get(b.m, &mm);
    const phase_ms ph = phases_of(&b.phases0, &b.phases1);
    int64_t recaptures = 0;
    for (int i = 0; i < OG_BATCH_BUCKETS; i++) recaptures += mm.bucket_captures[i] > 1 ? mm.bucket_captures[i] - 1 : 0;
    if (json) {
        printf("{\"mode\":\"%s\",\"prompt\":%lld,\"gen\":%lld,\"sessions\":%lld,\"prefill_tokens_per_s\":%.2f,"
               "\"decode_tokens_per_s\":%.2f,\"decode_tokens_per_s_per_session\":%.2f,\"decode_s\":%.6f,"
               "\"kv_bytes_allocated\":%lld,\"kv_bytes_live\":%lld,\"growth_events\":%lld,\"steps\":%lld,"
               "\"graph_captures\":%lld,\"session_graph_captures\":%lld,\"recaptures\":%lld,\"bucket_captures\":[",
               mode, (long long)prompt, (long long)gen, (long long)sessions, pf, dc, dc / (double)sessions, t_decode,
               (long long)tot.bytes_allocated, (long long)tot.bytes_live, (long long)tot.growth_count,
               (long long)mm.steps, (long long)mm.graph_captures, (long long)tot.graph_captures, (long long)recaptures);
        print_buckets(mm.bucket_captures);
        printf("],\"bucket_replays\":[");
        print_buckets(mm.bucket_replays);
        printf("]");
        if (step_ms >= 0) printf(",\"step_ms\":%.4f,\"gap_ms\":%.4f", step_ms, gap_ms);
        if (ph.steps > 0)
            printf(",\"prepare_ms\":%.4f,\"submit_ms\":%.4f,\"wait_ms\":%.4f,\"finish_ms\":%.4f", ph.prepare,
                   ph.submit, ph.wait, ph.finish);
        printf("}\n");
    } else {
        printf("%lld sessions (%s), prompt %lld, generated %lld tokens each\n", (long long)sessions, mode,
               (long long)prompt, (long long)gen);
        printf("  prefill          %10.1f tokens/s\n", pf);
        printf("  decode, all      %10.1f tokens/s\n", dc);
        printf("  decode, each     %10.1f tokens/s\n", dc / (double)sessions);
        printf("  KV allocated     %10.2f MiB\n", (double)tot.bytes_allocated / 1048576.0);
        printf("  KV live          %10.2f MiB\n", (double)tot.bytes_live / 1048576.0);
        printf("  growth events    %10lld\n", (long long)tot.growth_count);
        printf("  batched steps    %10lld\n", (long long)mm.steps);
        printf("  graph captures   %10lld (%lld re-captures); by bucket [", (long long)mm.graph_captures,
               (long long)recaptures);
        print_buckets(mm.bucket_captures);
        printf("], replays [");
        print_buckets(mm.bucket_replays);
        printf("]\n");
        if (step_ms >= 0)
            printf("  decode step      %10.3f ms in og_model_step, %.3f ms between steps (the %s's own work)\n",
                   step_ms, gap_ms, strcmp(mode, "engine") ? "caller" : "engine");
        if (ph.steps > 0)
            printf("  of which         %10.3f ms prepare, %.3f submit, %.3f wait for the device, %.3f finish\n",
                   ph.prepare, ph.submit, ph.wait, ph.finish);
    }
    rc = 0;
done:
    if (b.ss)
        for (int64_t k = 0; k < sessions; k++) og_session_destroy(b.ss[k]);
    free(b.ss);
    free(b.ids);
    free(b.next);
    free(b.items);
    free(b.who);
    free(b.fed);
    og_model_destroy(b.m);
    return rc;
}
