/* Text generation shared by run and chat (see generate.h). */
#include "generate.h"

#include "cli.h"
#include "core/core.h"


#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The demo model the build exports (CMakeLists.txt: models/kjv-tiny). */
#ifdef OG_DEFAULT_PROGRAM
const char *const og_default_model_path = OG_DEFAULT_PROGRAM;
#else
const char *const og_default_model_path = NULL;
#endif

void og_gen_default_options(og_gen_options *o) {
    memset(o, 0, sizeof *o);
    og_cli_model_opts_default(&o->run);
    o->sampling = og_sampler_default_params();
    o->sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    o->max_tokens = 128;
}

static bool parse_float(const char *cmd, const char *flag, const char *v, double lo, double hi, float *out) {
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "offgraph %s: %s needs a number in [%g, %g], not \"%s\"\n", cmd, flag, lo, hi, v ? v : "");
        return false;
    }
    *out = (float)x;
    return true;
}

int og_gen_parse_option(const char *cmd, int argc, char **argv, int *i, og_gen_options *o) {
    const char *a = argv[*i], *v;
    int64_t n;
    int r = og_cli_model_option(cmd, argc, argv, i, &o->run);
    if (r != 0) return r;
    if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_int(cmd, a, v, 0, INT32_MAX, &o->max_tokens)) return -1;
        return 1;
    }
    if (!strcmp(a, "--no-special")) {
        o->no_special = true;
        return 1;
    }
    if (!strcmp(a, "--temp") || !strcmp(a, "--temperature"))
        return (v = og_cli_value(cmd, argc, argv, i)) && parse_float(cmd, a, v, 0, 100, &o->sampling.temperature) ? 1 : -1;
    if (!strcmp(a, "--top-p"))
        return (v = og_cli_value(cmd, argc, argv, i)) && parse_float(cmd, a, v, 0, 1, &o->sampling.top_p) ? 1 : -1;
    if (!strcmp(a, "--min-p"))
        return (v = og_cli_value(cmd, argc, argv, i)) && parse_float(cmd, a, v, 0, 1, &o->sampling.min_p) ? 1 : -1;
    if (!strcmp(a, "--repeat-penalty"))
        return (v = og_cli_value(cmd, argc, argv, i)) && parse_float(cmd, a, v, 0.01, 100, &o->sampling.repeat_penalty)
                   ? 1
                   : -1;
    if (!strcmp(a, "--top-k") || !strcmp(a, "--repeat-last-n") || !strcmp(a, "--seed")) {
        if (!(v = og_cli_value(cmd, argc, argv, i)) || !og_cli_int(cmd, a, v, 0, INT64_MAX, &n)) return -1;
        if (!strcmp(a, "--seed")) o->sampling.seed = (uint64_t)n;
        else if (n > INT32_MAX) {
            fprintf(stderr, "offgraph %s: %s is too large\n", cmd, a);
            return -1;
        } else if (!strcmp(a, "--top-k")) o->sampling.top_k = (int32_t)n;
        else o->sampling.repeat_last_n = (int32_t)n;
        return 1;
    }
    return 0;
}

void og_gen_options_usage(FILE *f) {
    og_cli_model_opts_usage(f);
    fprintf(f, "  -n, --max-tokens <N>     most tokens to generate (default 128)\n"
               "  --temp <T>               temperature; 0 is greedy (default 0.8)\n"
               "  --top-k <K>              keep the K most likely tokens; 0 keeps all (default 40)\n"
               "  --top-p <P>              keep the smallest set of mass >= P (default 0.95)\n"
               "  --min-p <P>              drop tokens below P x the most likely (default 0.05)\n"
               "  --repeat-penalty <R>     discourage the last --repeat-last-n tokens (default 1, off)\n"
               "  --repeat-last-n <N>      (default 64)\n"
               "  --seed <S>               random seed; the same seed repeats a run (default: from the clock)\n"
               "  --no-special             add no BOS (or other special tokens the tokenizer adds)\n"
               "                           to the prompt\n");
}

void og_gen_add_stop(og_gen *g, int32_t id) {
    if (id < 0 || g->n_stop == (int32_t)(sizeof g->stop / sizeof g->stop[0])) return;
    for (int32_t i = 0; i < g->n_stop; i++)
        if (g->stop[i] == id) return;
    g->stop[g->n_stop++] = id;
}

bool og_gen_load(const char *cmd, const og_gen_options *o, og_gen *g) {
    memset(g, 0, sizeof *g);
    const char *path = o->run.model ? o->run.model : og_default_model_path;
    if (!path) {
        fprintf(stderr, "offgraph %s: no -m given and no default model\n", cmd);
        return false;
    }
    if (!o->run.model && access(path, R_OK) != 0) {
        fprintf(stderr, "offgraph %s: no -m given and the default model %s is missing: `make` exports it from "
                        "models/kjv-tiny\n", cmd, path);
        return false;
    }
    if (!(g->model = og_cli_load_model(cmd, path, o->run.backend, o->run.threads))) return false;
    const char *json = og_model_tokenizer_json(g->model);
    if (!json) {
        const char *why = og_model_no_tokenizer_reason(g->model);
        fprintf(stderr,
                "offgraph %s: %s has no tokenizer%s%s%s: export it from a checkpoint folder that has tokenizer.json "
                "or a GGUF file with a vocabulary (offgraph eval, bench and perplexity --tokens work without one, "
                "on token ids)\n",
                cmd, path, why ? " (" : "", why ? why : "", why ? ")" : "");
        return false;
    }
    og_status st = og_tokenizer_load_json(json, &g->tok);
    if (st == OG_OK) st = og_tokenizer_load_config(g->tok, og_model_tokenizer_config(g->model));
    if (st != OG_OK) {
        fprintf(stderr, "offgraph %s: the tokenizer of %s: %s\n", cmd, path, og_last_error());
        return false;
    }
    int32_t stops[8];
    int32_t n_stops = og_tokenizer_stop_ids(g->tok, stops, 8);
    for (int32_t i = 0; i < n_stops && i < 8; i++) og_gen_add_stop(g, stops[i]);
    g->no_special = o->no_special;
    g->vocab = og_model_vocab_size(g->model);
    g->max_ctx = og_model_kv_config(g->model)->max_capacity;
    return true;
}

bool og_gen_open(const char *cmd, const og_gen_options *o, og_gen *g) {
    if (!og_gen_load(cmd, o, g)) return false;
    og_status st;
    if ((st = og_session_create(g->model, &o->run.session, &g->session)) != OG_OK ||
        (st = og_sampler_create(&o->sampling, g->vocab, &g->sampler)) != OG_OK) {
        fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
        return false;
    }
    for (int64_t i = 0; i < g->vocab && st == OG_OK; i++)
        if (!og_tokenizer_token_text(g->tok, (int32_t)i)) st = og_sampler_forbid(g->sampler, (int32_t)i);
    if (st != OG_OK) {
        fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
        return false;
    }
    return true;
}

void og_gen_close(og_gen *g) {
    og_engine_destroy(g->engine);
    og_sampler_destroy(g->sampler);
    og_session_destroy(g->session);
    og_tokenizer_destroy(g->tok);
    og_model_destroy(g->model);
    memset(g, 0, sizeof *g);
}

/* Feeds ids and, when draw, draws the token that follows them into g->next
 * (without, the sampler does not move: no draw is spent that is not used). */
static bool feed(const char *cmd, og_gen *g, const int32_t *ids, int64_t n, bool draw) {
    og_status st = draw ? og_session_eval_sample(g->session, ids, n, 0, g->sampler, &g->next)
                        : og_session_eval(g->session, ids, n, 0, NULL, 0);
    if (st != OG_OK) {
        fprintf(stderr, "offgraph %s: %s (%s)\n", cmd, og_session_last_error(g->session), og_status_str(st));
        return false;
    }
    return true;
}

bool og_gen_prompt_fits(const char *cmd, const og_gen *g, int64_t n) {
    if (n <= g->max_ctx) return true;
    fprintf(stderr,
            "offgraph %s: the prompt is %lld tokens, more than the model's context limit of %lld tokens: shorten "
            "it, or export the checkpoint again with a larger --max-context (offgraph export <hf_dir> -o <file> "
            "--max-context N)\n",
            cmd, (long long)n, (long long)g->max_ctx);
    return false;
}

bool og_gen_encode(const char *cmd, const og_gen *g, const char *text, bool special, int32_t **ids, int64_t *n) {
    unsigned flags = OG_TOKENIZE_PARSE_SPECIAL | (special && !g->no_special ? OG_TOKENIZE_ADD_SPECIAL : 0u);
    if (og_tokenize(g->tok, text, strlen(text), flags, ids, n) != OG_OK) {
        fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
        return false;
    }
    return true;
}

bool og_gen_prefill(const char *cmd, og_gen *g, const int32_t *ids, int64_t n, bool draw) {
    for (int64_t i = 0; i < n; i++) og_sampler_accept(g->sampler, ids[i]);
    return feed(cmd, g, ids, n, draw);
}

/* Appends text to r->text (when kept). */
static bool keep(og_gen_result *r, size_t *cap, size_t *len, const char *text, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *p = og_realloc(r->text, nc);
        if (!p) return false;
        r->text = p;
        *cap = nc;
    }
    memcpy(r->text + *len, text, n);
    *len += n;
    r->text[*len] = 0;
    return true;
}

bool og_gen_decode(const char *cmd, og_gen *g, int64_t max, bool feed_last, FILE *out, bool keep_text,
                   og_gen_result *r) {
    memset(r, 0, sizeof *r);
    r->finish = OG_FINISH_LENGTH;
    size_t cap = 0, kept = 0;
    if (keep_text && !keep(r, &cap, &kept, "", 0)) return false;
    if (max <= 0) return true; /* nothing was drawn (og_gen_prefill without draw) */
    og_textgen_params tp = {.max_tokens = max,
                            .stop_ids = g->stop,
                            .n_stop_ids = g->n_stop,
                            .stop_strings = g->stop_strings,
                            .n_stop_strings = g->n_stop_strings};
    og_textgen *tg = NULL;
    if (og_textgen_create(g->tok, &tp, &tg) != OG_OK) {
        fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
        return false;
    }
    bool ok = true;
    for (og_finish fin = OG_FINISH_NONE; ok && fin == OG_FINISH_NONE;) {
        const int32_t t = g->next;
        const char *text = "";
        size_t len = 0;
        og_status st = OG_OK;
        /* the session is full: t cannot be fed. Where the reply must stay in
         * the cache it is not given out; otherwise it is the last one. */
        const bool full = og_session_length(g->session) >= g->max_ctx;
        if (g->interrupt && *g->interrupt) {
            r->interrupted = true;
            st = og_textgen_end(tg, OG_FINISH_STOP, &text, &len);
        } else if (full && feed_last) {
            r->context_full = true;
            st = og_textgen_end(tg, OG_FINISH_LENGTH, &text, &len);
        } else {
            const int64_t before = og_textgen_tokens(tg);
            st = og_textgen_push(tg, t, &text, &len, &fin);
            if (st == OG_OK) {
                fwrite(text, 1, len, out);
                if (keep_text && !keep(r, &cap, &kept, text, len)) ok = false;
                len = 0;
                if (fin == OG_FINISH_NONE && full) {
                    r->context_full = true;
                    st = og_textgen_end(tg, OG_FINISH_LENGTH, &text, &len);
                } else if (ok && og_textgen_tokens(tg) > before && (fin == OG_FINISH_NONE || feed_last)) {
                    /* a generated token (not a stop token) is fed: drawing the
                     * next one while generation goes on, and the last one only
                     * when feed_last */
                    ok = feed(cmd, g, &t, 1, fin == OG_FINISH_NONE);
                    if (ok && keep_text) {
                        int32_t *p = og_realloc(r->ids, (size_t)(r->n_ids + 1) * sizeof *p);
                        if (!p) ok = false;
                        else {
                            r->ids = p;
                            r->ids[r->n_ids++] = t;
                        }
                    }
                }
            }
        }
        if (st != OG_OK) {
            fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
            ok = false;
            break;
        }
        if (len) {
            fwrite(text, 1, len, out);
            if (keep_text && !keep(r, &cap, &kept, text, len)) ok = false;
        }
        fflush(out);
        fin = og_textgen_finish_reason(tg);
    }
    r->generated = og_textgen_tokens(tg);
    r->finish = og_textgen_finish_reason(tg);
    og_textgen_destroy(tg);
    return ok;
}

bool og_gen_start_engine(const char *cmd, const og_gen_options *o, og_gen *g, int64_t prefix_cache_bytes) {
    og_engine_params ep = og_engine_default_params();
    ep.session = o->run.session;
    ep.max_sessions = 1;
    ep.prefix_cache_bytes = prefix_cache_bytes;
    if (og_engine_create(g->model, g->tok, &ep, &g->engine) != OG_OK) {
        fprintf(stderr, "offgraph %s: %s\n", cmd, og_last_error());
        return false;
    }
    return true;
}

og_request_params og_gen_request_params(const og_gen_options *o) {
    og_request_params p = og_request_default_params();
    p.sampling = o->sampling;
    p.max_tokens = o->max_tokens;
    p.add_special = !o->no_special;
    return p;
}

bool og_gen_stream(const char *cmd, og_request *r, FILE *out, volatile sig_atomic_t *interrupt,
                   og_request_output *last, char **text) {
    size_t cap = 0, len = 0;
    if (text) *text = NULL;
    bool cancelled = false;
    for (;;) {
        og_request_output o;
        /* what has come, without waiting; when nothing has, a millisecond's
         * sleep before looking again: the text comes in runs of tokens
         * rather than waking this thread (off the core the engine's thread
         * needs) at every one */
        og_request_next(r, &o, 0);
        if (!o.n_text && o.finish == OG_FINISH_NONE) {
            if (interrupt && *interrupt && !cancelled) {
                og_request_cancel(r);
                cancelled = true;
            }
            nanosleep(&(struct timespec){0, 1000000}, NULL);
            continue;
        }
        if (o.n_text) {
            fwrite(o.text, 1, o.n_text, out);
            fflush(out);
            if (text) {
                if (len + o.n_text + 1 > cap) {
                    size_t nc = (len + o.n_text + 1) * 2;
                    char *p = og_realloc(*text, nc);
                    if (!p) {
                        fprintf(stderr, "offgraph %s: no memory\n", cmd);
                        og_request_cancel(r);
                        return false;
                    }
                    *text = p;
                    cap = nc;
                }
                memcpy(*text + len, o.text, o.n_text);
                len += o.n_text;
                (*text)[len] = 0;
            }
        }
        if (o.finish != OG_FINISH_NONE) {
            *last = o;
            last->text = NULL;
            last->n_text = 0;
            last->tokens = NULL;
            last->n_tokens = 0;
            last->logprobs = NULL;
            last->n_logprobs = 0;
            if (o.finish == OG_FINISH_ERROR) {
                fprintf(stderr, "offgraph %s: %s (%s)\n", cmd, o.error, og_status_str(o.status));
                return false;
            }
            return true;
        }
        if (interrupt && *interrupt && !cancelled) {
            og_request_cancel(r);
            cancelled = true;
        }
    }
}
