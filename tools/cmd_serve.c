/* offgraph serve: the OpenAI-compatible HTTP server (src/serve). This file
 * only reads the options, starts the server and waits for SIGINT/SIGTERM. */
#include "cli.h"
#include "commands.h"
#include "request.h"
#include "kv/kv.h"
#include "serve/serve.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: offgraph serve [-m <model>] [--host 127.0.0.1] [--port 8080] [--max-sessions N]\n"
            "                      [--kv-budget BYTES] [--api-key KEY] [options]\n\n"
            "An OpenAI-compatible HTTP server with continuous batching: every running request\n"
            "steps together in one batched model step; new ones join at the next step.\n\n"
            "Endpoints: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for\n"
            "server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus).\n"
            "SIGINT or SIGTERM stops it: no new requests, running ones get --shutdown-grace\n"
            "seconds to finish, then it exits 0.\n\n"
            "  --model-id <name>        the model name clients use (default: -m's file or folder\n"
            "                           name, without .ogp or .gguf; -m defaults to the demo model)\n"
            "  --host <addr>            address to listen on (default 127.0.0.1)\n"
            "  --port <N>               port (default 8080; 0 picks a free one, printed at start)\n"
            "  --max-sessions <N>       requests generating at once (default 256 on a GPU, where one\n"
            "                           batched step of 256 costs little more than one of 64; 64 on\n"
            "                           the CPU)\n"
            "  --kv-budget <BYTES>      KV bytes all sessions together may hold, e.g. 512M or 2G\n"
            "                           (default 0: no bound); a request that does not fit waits\n"
            "  --prefix-cache-bytes <BYTES>  KV bytes of finished requests kept so that a prompt\n"
            "                           starting with one (the history of a chat) forks it and\n"
            "                           reads only the rest (default 1G; 0: off); part of\n"
            "                           --kv-budget, evicted first when a request needs room\n"
            "  --max-queue <N>          requests that may wait; past it: 429 (default 256)\n"
            "  --api-key <KEY>          require 'Authorization: Bearer KEY' (all but /health);\n"
            "                           also read from OFFGRAPH_API_KEY\n"
            "  --max-body <BYTES>       request body limit (default 1M)\n"
            "  --chunk <N>              prompt tokens of one request per step (default 256)\n"
            "  --step-rows <N>          tokens per batched step, all requests (default 512; -b too)\n"
            "  --shutdown-grace <S>     seconds running requests get at shutdown (default 5)\n"
            "  --max-connections-per-ip <N>  open connections from one client address; past it\n"
            "                           a new one is closed at once (default: max-sessions +\n"
            "                           max-queue + 64, 384 with 64 sessions: every request the\n"
            "                           server admits, and 64 more to be answered 429; 0: no bound, e.g.\n"
            "                           behind a proxy, whose address every client has)\n"
            "  --max-connections <N>    open connections in all; past it a new one is closed at\n"
            "                           once (default: 2 x (max-sessions + max-queue) + 192, 832\n"
            "                           with 64 sessions:\n"
            "                           every admitted request, one address at its bound, and\n"
            "                           128 to spare)\n"
            "  --header-timeout <S>     a request's headers must be in S seconds after the\n"
            "                           connection opened or the last response ended; bytes do\n"
            "                           not extend it; late: 408 and closed (default 10)\n"
            "  --min-body-rate <BYTES>  a body must arrive at this many bytes a second on\n"
            "                           average after --header-timeout of grace (default 16K)\n"
            "  --write-timeout <S>      output must reach the client's socket S seconds after it\n"
            "                           was produced; a client that stops reading its stream is\n"
            "                           disconnected and its request cancelled (default 30)\n"
            "  --seed <S>               base of the seeds of requests that give none: the same\n"
            "                           requests in the same order draw the same text (default:\n"
            "                           from the clock)\n"
            "  --log-requests           one line per request on stderr\n");
    og_cli_model_opts_usage(f);
}

/* "512", "64K", "512M", "2G" (binary units). */
static bool parse_bytes(const char *flag, const char *v, int64_t *out) {
    char *end = NULL;
    double x = strtod(v, &end);
    int64_t unit = 1;
    if (end && *end) {
        switch (*end) {
        case 'k': case 'K': unit = 1 << 10; break;
        case 'm': case 'M': unit = 1 << 20; break;
        case 'g': case 'G': unit = 1 << 30; break;
        default: unit = 0;
        }
        if (unit && end[1] && strcmp(end + 1, "B") && strcmp(end + 1, "iB") && strcmp(end + 1, "b")) unit = 0;
    }
    if (end == v || !unit || !(x >= 0) || x * (double)unit > 9e18) {
        fprintf(stderr, "offgraph serve: %s expects a byte count (e.g. 1048576, 512M, 2G), got \"%s\"\n", flag, v);
        return false;
    }
    *out = (int64_t)(x * (double)unit);
    return true;
}

/* Seconds: a positive number up to a day. */
static bool parse_seconds(const char *flag, const char *v, double *out) {
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0 && x <= 86400)) {
        fprintf(stderr, "offgraph serve: %s expects seconds (a number > 0, at most 86400), got \"%s\"\n", flag, v);
        return false;
    }
    *out = x;
    return true;
}

/* Every connection is a descriptor: the soft open-file limit goes up to what
 * --max-connections needs (the model, the log and the sockets of the
 * threads besides), as far as the hard limit allows. */
static void raise_file_limit(int32_t max_connections) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    const rlim_t want = (rlim_t)max_connections + 128;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rlim_t cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        struct rlimit nl = {cur, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &nl) == 0) rl.rlim_cur = cur;
        if (rl.rlim_cur < want)
            fprintf(stderr, "offgraph serve: the open-file limit (%llu) is below --max-connections %d + 128: "
                            "connections past it will be refused; raise it (ulimit -n) or lower --max-connections\n",
                    (unsigned long long)rl.rlim_cur, (int)max_connections);
    }
}

int og_cmd_serve(int argc, char **argv) {
    og_serve_params p = og_serve_default_params();
    og_cli_model_opts mo;
    og_cli_model_opts_default(&mo);
    p.api_key = getenv("OFFGRAPH_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int64_t n;
        int r = og_cli_model_option("serve", argc, argv, &i, &mo);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--log-requests")) {
            p.log_requests = 1;
        } else if (!strcmp(a, "--host") || !strcmp(a, "--api-key") || !strcmp(a, "--model-id")) {
            if (!(v = og_cli_value("serve", argc, argv, &i))) return 2;
            if (!strcmp(a, "--host")) p.host = v;
            else if (!strcmp(a, "--api-key")) p.api_key = v;
            else p.model_id = v;
        } else if (!strcmp(a, "--kv-budget") || !strcmp(a, "--max-body") || !strcmp(a, "--prefix-cache-bytes")) {
            if (!(v = og_cli_value("serve", argc, argv, &i)) || !parse_bytes(a, v, &n)) return 2;
            if (!strcmp(a, "--kv-budget")) p.kv_budget = n;
            else if (!strcmp(a, "--prefix-cache-bytes")) p.prefix_cache_bytes = n;
            else if (n < 1) {
                fprintf(stderr, "offgraph serve: --max-body must be at least 1 byte\n");
                return 2;
            } else p.max_body = (size_t)n;
        } else if (!strcmp(a, "--header-timeout") || !strcmp(a, "--write-timeout")) {
            double sec;
            if (!(v = og_cli_value("serve", argc, argv, &i)) || !parse_seconds(a, v, &sec)) return 2;
            if (!strcmp(a, "--header-timeout")) p.header_timeout_s = sec;
            else p.write_timeout_s = sec;
        } else if (!strcmp(a, "--min-body-rate")) {
            if (!(v = og_cli_value("serve", argc, argv, &i)) || !parse_bytes(a, v, &n)) return 2;
            if (n < 1) {
                fprintf(stderr, "offgraph serve: --min-body-rate must be at least 1 byte a second\n");
                return 2;
            }
            p.min_body_rate = n;
        } else if (!strcmp(a, "--max-connections") || !strcmp(a, "--max-connections-per-ip")) {
            const bool per_ip = !strcmp(a, "--max-connections-per-ip");
            if (!(v = og_cli_value("serve", argc, argv, &i)) || !og_cli_int("serve", a, v, per_ip ? 0 : 1, 1 << 20, &n))
                return 2;
            if (per_ip) p.max_connections_per_ip = (int32_t)n;
            else p.max_connections = (int32_t)n;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = og_cli_value("serve", argc, argv, &i)) || !og_cli_int("serve", a, v, 1, INT64_MAX, &n)) return 2;
            p.seed = (uint64_t)n;
        } else if (!strcmp(a, "--shutdown-grace")) {
            if (!(v = og_cli_value("serve", argc, argv, &i)) || !og_cli_int("serve", a, v, 0, 3600, &n)) return 2;
            p.shutdown_grace_s = (double)n;
        } else if (!strcmp(a, "--port") || !strcmp(a, "--max-sessions") || !strcmp(a, "--max-queue") ||
                   !strcmp(a, "--chunk") || !strcmp(a, "--step-rows")) {
            const bool port = !strcmp(a, "--port"), queue = !strcmp(a, "--max-queue");
            if (!(v = og_cli_value("serve", argc, argv, &i)) ||
                !og_cli_int("serve", a, v, port || queue ? 0 : 1, port ? 65535 : 1 << 20, &n))
                return 2;
            if (port) p.port = (int32_t)n;
            else if (queue) p.max_queue = (int32_t)n;
            else if (!strcmp(a, "--max-sessions")) p.max_sessions = (int32_t)n;
            else if (!strcmp(a, "--chunk")) p.chunk = (int32_t)n;
            else p.step_rows = (int32_t)n;
        } else {
            fprintf(stderr, "offgraph serve: unknown option \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    const char *source = mo.model ? mo.model : og_default_model_path;
    p.model_path = source;
    if (!p.model_path) {
        fprintf(stderr, "offgraph serve: no -m given and no default model\n");
        return 2;
    }
    if (!mo.model && access(p.model_path, R_OK) != 0) {
        fprintf(stderr, "offgraph serve: no -m given and the default model %s is missing: `make` exports it from "
                        "models/kjv-tiny\n", p.model_path);
        return 1;
    }
    /* tests hold requests running with it (tests/cli_serve_flood.sh) */
    const char *delay = getenv("OFFGRAPH_TEST_STEP_DELAY_MS");
    if (delay && *delay) p.test_step_delay_s = atof(delay) / 1000;
    /* and make every n-th KV allocation fail (tests/cli_serve_faults.sh) */
    const char *kv_fail = getenv("OFFGRAPH_TEST_KV_FAIL_EVERY");
    if (kv_fail && *kv_fail) og_kv_test_fail_every = atoll(kv_fail);
    /* a checkpoint folder or a GGUF file: the program exported from it
     * into the cache, served under the source's name */
    char *resolved = og_cli_resolve_model("serve", p.model_path, mo.weights, mo.ctx);
    if (!resolved) return 1;
    char id[256];
    if (!p.model_id && strcmp(resolved, source)) {
        /* the folder's or the file's name: "models/llama/" is llama, x.gguf x */
        size_t end = strlen(source);
        while (end > 1 && source[end - 1] == '/') end--;
        size_t start = end;
        while (start > 0 && source[start - 1] != '/') start--;
        if (end - start > 5 && !strncmp(source + end - 5, ".gguf", 5)) end -= 5;
        snprintf(id, sizeof id, "%.*s", (int)(end - start), source + start);
        p.model_id = id;
    }
    p.model_path = resolved;
    p.context = mo.ctx;
    if (mo.batch) p.step_rows = (int32_t)mo.batch;
    p.model.backend = mo.backend;
    p.model.n_threads = mo.threads;
    p.model.tensor_parallel = mo.tensor_parallel > 0 ? mo.tensor_parallel : 1;
    og_cli_devices(&mo, &p.model);
    og_serve_resolve_params(&p);
    raise_file_limit(p.max_connections);
    p.session = mo.session;

    /* SIGINT/SIGTERM are taken by sigwait below: blocked in every thread
     * the server starts (they inherit this mask) */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    og_server *srv = NULL;
    og_status st = og_server_start(&p, &srv);
    if (st != OG_OK) {
        fprintf(stderr, "offgraph serve: %s (%s)\n", og_last_error(), og_status_str(st));
        free(resolved);
        return 1;
    }
    const char *host = p.host ? p.host : "127.0.0.1";
    fprintf(stderr, "offgraph serve: model %s (%s), listening on http://%s%s%s:%d (%d requests at once, %d may wait)\n",
            og_server_model_id(srv), p.model_path, strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
            (int)og_server_port(srv), (int)p.max_sessions, (int)p.max_queue);
    fflush(stderr);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    fprintf(stderr, "offgraph serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    og_server_destroy(srv);
    free(resolved);
    fprintf(stderr, "offgraph serve: stopped\n");
    return 0;
}
