/* What run and chat share around the engine (see request.h). */
#include "request.h"

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
    if (!strcmp(a, "--grammar") || !strcmp(a, "--json-schema")) {
        if (!(v = og_cli_value(cmd, argc, argv, i))) return -1;
        const bool schema = a[2] == 'j';
        if (o->grammar || o->json_schema) {
            fprintf(stderr, "offgraph %s: one --grammar or --json-schema, not two\n", cmd);
            return -1;
        }
        *(schema ? &o->json_schema : &o->grammar) = v;
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
               "                           to the prompt\n"
               "  --grammar <file>         the output follows this GBNF grammar (llama.cpp's format,\n"
               "                           start rule root); GBNF text is taken as well\n"
               "  --json-schema <file|json>  the output is JSON that this JSON schema validates\n"
               "                           (types, properties, required, enum, const, items, anyOf...;\n"
               "                           a keyword or string format it cannot enforce is refused)\n");
}

/* The grammar of --grammar or --json-schema: an existing file's content,
 * else the value itself when it reads as GBNF (holds "::=") or JSON (starts
 * with "{"). NULL (after a message) when it is neither or does not compile. */
static og_grammar *compile_grammar(const char *cmd, const og_gen_options *o) {
    const bool schema = o->json_schema != NULL;
    const char *v = schema ? o->json_schema : o->grammar, *flag = schema ? "--json-schema" : "--grammar";
    char *text = NULL;
    const char *src = v;
    if (access(v, R_OK) == 0) {
        if (!(text = og_cli_read_file(cmd, v))) return NULL;
        src = text;
    } else if (schema ? v[strspn(v, " \t\r\n")] != '{' : !strstr(v, "::=")) {
        fprintf(stderr, "offgraph %s: %s %s: no such file (nor %s text)\n", cmd, flag, v,
                schema ? "a JSON object" : "GBNF");
        return NULL;
    }
    og_grammar *gr = NULL;
    og_status st = schema ? og_grammar_from_json_schema(src, strlen(src), &gr) : og_grammar_parse(src, strlen(src), &gr);
    if (st != OG_OK) fprintf(stderr, "offgraph %s: %s %s: %s\n", cmd, flag, text ? v : "text", og_last_error());
    free(text);
    return gr;
}

bool og_gen_load(const char *cmd, const og_gen_options *o, og_gen *g) {
    memset(g, 0, sizeof *g);
    if ((o->grammar || o->json_schema) && !(g->grammar = compile_grammar(cmd, o))) return false;
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
    if (og_tokenizer_from_model(g->model, &g->tok) != OG_OK) {
        fprintf(stderr, "offgraph %s: the tokenizer of %s: %s\n", cmd, path, og_last_error());
        return false;
    }
    if (g->grammar && (og_grammar_vocab_create(g->tok, og_model_vocab_size(g->model), NULL, 0, &g->gvocab) != OG_OK ||
                       og_matcher_create(g->grammar, g->gvocab, &g->matcher) != OG_OK)) {
        fprintf(stderr, "offgraph %s: %s: %s\n", cmd, o->grammar ? "--grammar" : "--json-schema", og_last_error());
        return false;
    }
    g->no_special = o->no_special;
    g->max_ctx = og_model_kv_config(g->model)->max_capacity;
    return true;
}

void og_gen_close(og_gen *g) {
    og_engine_destroy(g->engine);
    og_matcher_destroy(g->matcher);
    og_grammar_vocab_destroy(g->gvocab);
    og_grammar_destroy(g->grammar);
    og_tokenizer_destroy(g->tok);
    og_model_destroy(g->model);
    memset(g, 0, sizeof *g);
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

void og_gen_constrain(og_gen *g, og_request_params *p) {
    if (!g->matcher) return;
    og_matcher_reset(g->matcher);
    p->constraint = og_grammar_constraint;
    p->constraint_ctx = g->matcher;
}

/* Appends n items of size to *buf [*len] (capacity *cap); false without memory. */
static bool append(void **buf, int64_t *len, int64_t *cap, const void *p, int64_t n, size_t size) {
    if (*len + n + 1 > *cap) {
        int64_t nc = (*len + n + 1) * 2;
        void *b = og_realloc(*buf, (size_t)nc * size);
        if (!b) return false;
        *buf = b;
        *cap = nc;
    }
    memcpy((char *)*buf + (size_t)*len * size, p, (size_t)n * size);
    *len += n;
    return true;
}

bool og_gen_stream(const char *cmd, og_request *r, FILE *out, volatile sig_atomic_t *interrupt, bool keep,
                   og_gen_reply *reply) {
    memset(reply, 0, sizeof *reply);
    int64_t len = 0, cap = 0, cap_ids = 0;
    bool cancelled = false;
    if (keep && !append((void **)&reply->text, &len, &cap, "", 1, 1)) goto oom;
    len = 0;
    for (;;) {
        og_request_output o;
        /* what has come, without waiting; when nothing has, a millisecond's
         * sleep before looking again: the text comes in runs of tokens
         * rather than waking this thread (off the core the engine's thread
         * needs) at every one */
        og_request_next(r, &o, 0);
        if (!o.n_text && !o.n_tokens && o.finish == OG_FINISH_NONE) {
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
            if (keep) {
                if (!append((void **)&reply->text, &len, &cap, o.text, (int64_t)o.n_text, 1)) goto oom;
                reply->text[len] = 0;
            }
        }
        if (keep && o.n_tokens && !append((void **)&reply->ids, &reply->n_ids, &cap_ids, o.tokens, o.n_tokens,
                                          sizeof *o.tokens))
            goto oom;
        if (o.finish != OG_FINISH_NONE) {
            reply->last = o;
            reply->last.text = NULL;
            reply->last.n_text = 0;
            reply->last.tokens = NULL;
            reply->last.n_tokens = 0;
            reply->last.logprobs = NULL;
            reply->last.n_logprobs = 0;
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
oom:
    fprintf(stderr, "offgraph %s: no memory\n", cmd);
    og_request_cancel(r);
    return false;
}
