/* offgraph demo: shows the KV manager on its own (no model, no kernels).
 * A 4-layer manifest with 2 flat and 2 ring layers serves a few sessions of
 * different lengths, stepped with prepare/commit (a prefill in max_write
 * chunks, then decode steps); per-session metrics and a capacity estimate
 * are printed as a table. */
#include "commands.h"
#include "offgraph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void demo_usage(FILE *f) {
    fprintf(f, "usage: offgraph demo [--sessions N] [--budget-mib M]\n\n"
               "Runs the KV manager alone: a 4-layer manifest (2 flat, 2 ring layers, bf16),\n"
               "N sessions (default 3, at most 16) each prefilled in max_write chunks and then\n"
               "decoded token by token, and prints per-session metrics and how far each\n"
               "session could still grow within a KV budget (default 64 MiB).\n");
}

/* Parses a positive integer option value in [1, max]; -1 on error. */
static long parse_count(const char *s, long max) {
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : -1;
    return s && *s && end && *end == '\0' && v >= 1 && v <= max ? v : -1;
}

int og_cmd_demo(int argc, char **argv) {
    long n_sessions = 3, budget_mib = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            demo_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--sessions") && i + 1 < argc) {
            n_sessions = parse_count(argv[++i], 16);
        } else if (!strcmp(argv[i], "--budget-mib") && i + 1 < argc) {
            budget_mib = parse_count(argv[++i], 1L << 20);
        } else {
            fprintf(stderr, "offgraph demo: unknown or incomplete option \"%s\"\n", argv[i]);
            demo_usage(stderr);
            return 2;
        }
        if (n_sessions < 0 || budget_mib < 0) {
            fprintf(stderr, "offgraph demo: %s needs a positive integer within range\n", argv[i - 1]);
            return 2;
        }
    }

    const og_kv_layer_config layers[4] = {
        {.layer_id = 0, .policy = OG_KV_RING, .window = 128, .n_kv_heads = 4, .head_dim = 64},
        {.layer_id = 1, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 4, .head_dim = 64},
        {.layer_id = 2, .policy = OG_KV_RING, .window = 128, .n_kv_heads = 4, .head_dim = 64},
        {.layer_id = 3, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 4, .head_dim = 64},
    };
    const og_kv_config cfg = {
        .version = OG_KV_MANIFEST_VERSION, .kv_dtype = OG_DTYPE_BF16, .max_capacity = 8192,
        .initial_capacity = 64, .max_write = 256, .n_model_layers = 4, .n_layers = 4, .layers = layers,
    };
    printf("manifest: 4 layers (flat 1, 3; ring 0, 2 with W=128, R=%lld), Hkv=4, D=64, bf16,\n"
           "          initial_capacity %lld, max_capacity %lld, max_write %d\n\n",
           (long long)og_kv_layer_slots(&cfg, &layers[0]), (long long)cfg.initial_capacity,
           (long long)cfg.max_capacity, (int)cfg.max_write);

    printf("%-7s %7s %7s %10s %6s %12s %12s %7s %8s %10s\n", "session", "prompt", "decode", "length", "steps",
           "bytes alloc", "bytes live", "growth", "rebinds", "reachable");
    int rc = 0;
    const int64_t budget = (int64_t)budget_mib << 20;
    og_kv_capacity cap = {0};
    og_kv_session *sessions[16] = {0}; /* all alive at once: each owns its own storage */
    for (long i = 0; i < n_sessions; i++) {
        og_kv_session *s = NULL;
        og_status st = og_kv_session_create(&cfg, NULL, &s);
        sessions[i] = s;
        /* Session i: a prompt of 100 * 3^i tokens (capped), then 20 decode steps. */
        int64_t prompt = 100, decode = 20;
        for (long j = 0; j < i && prompt < cfg.max_capacity; j++) prompt *= 3;
        if (prompt > cfg.max_capacity - decode) prompt = cfg.max_capacity - decode;
        for (int64_t done = 0; st == OG_OK && done < prompt + decode;) {
            int32_t T = done < prompt ? (int32_t)(prompt - done < cfg.max_write ? prompt - done : cfg.max_write) : 1;
            st = og_kv_session_prepare(s, T);
            if (st == OG_OK) st = og_kv_session_commit(s, T);
            done += T;
        }
        og_kv_metrics m = {0};
        if (st == OG_OK) st = og_kv_session_metrics(s, &m);
        if (st == OG_OK) st = og_kv_session_capacity(s, budget, &cap);
        if (st != OG_OK) {
            fprintf(stderr, "offgraph demo: session %ld: %s: %s\n", i, og_status_str(st),
                    s ? og_kv_session_last_error(s) : og_last_error());
            rc = 1;
        } else {
            printf("%-7ld %7lld %7lld %10lld %6lld %12lld %12lld %7lld %8lld %10lld\n", i, (long long)prompt,
                   (long long)decode, (long long)m.length, (long long)m.steps, (long long)m.bytes_allocated,
                   (long long)m.bytes_live, (long long)m.growth_count, (long long)m.rebinds,
                   (long long)cap.tokens_reachable);
        }
    }
    for (long i = 0; i < n_sessions; i++) og_kv_session_destroy(sessions[i]);
    if (rc == 0)
        printf("\nbudget %ld MiB: a fresh session's first step takes %lld bytes, so %lld fresh sessions fit;\n"
               "one more token of history costs %lld bytes in the flat layers.\n",
               budget_mib, (long long)cap.fresh_session_bytes, (long long)cap.fresh_sessions,
               (long long)cap.bytes_per_token);
    return rc;
}
