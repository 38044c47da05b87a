/* The engine (og_engine, include/offgraph.h) without HTTP, on the CPU, over
 * the demo checkpoint (models/kjv-tiny, exported here with a context of 256
 * tokens) and its tokenizer. The reference for every output checked is a
 * plain og_session loop written here: the prompt fed in the engine's chunks,
 * then one token at a time, each next token the arg-max of the logits over
 * the ids the tokenizer knows, until a stop id or max_tokens. (The program
 * starts its flat layers at 16 rows, so KV bytes grow with the tokens.)
 *   - greedy requests give the reference's tokens, and their text is the
 *     decode of those tokens; the text prompt is og_tokenize(ADD_SPECIAL |
 *     PARSE_SPECIAL) of the text; logprobs equal the reference's
 *     log-softmax;
 *   - prefix hits: a second request with the same prompt (and one that
 *     extends it) reuses the cached prefix and gives the cold tokens;
 *   - admission under a KV budget: requests that fit one at a time run one
 *     at a time (their generation intervals never overlap) and all finish
 *     right; a request larger than the whole budget, or with a prompt past
 *     the context, is refused (OG_ERR_CAPACITY) by name;
 *   - a full queue is refused (OG_ERR_BUSY); a waiting request can be
 *     cancelled; cancellation mid-generation ends a request (CANCELLED)
 *     and frees its session;
 *   - fairness: short requests submitted behind a long prompt finish
 *     before the long one has drawn its first token;
 *   - 8 threads submitting 4 requests each at once: every output is the
 *     reference's;
 *   - the constraint hook; token prompts on an engine without a tokenizer;
 *     og_engine_stop ends waiting and running requests;
 *   - requests that go on in a session of the caller's (a chat's turns):
 *     each turn's tokens are those of a plain session loop fed the same way
 *     (the turn's prompt, then each reply token, the last one too), the
 *     session holds exactly that afterwards; at the context limit, when
 *     cancelled or destroyed mid-reply it holds every token given out;
 *     a prompt past what is left is refused, as is a second request on a
 *     session still in use;
 *   - n choices (og_engine_submit_n): the prompt is prefilled once; greedy
 *     choices are the reference's; sampled choice 0 is the request alone
 *     with its seed and the others differ; cancelling the first choice at
 *     once leaves the others to read the prompt themselves. */
#include "harness.h"

#include "import/export.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CTX 256
#define CHUNK 32

static og_model *g_model;
static og_tokenizer *g_tok;
static int64_t g_vocab;
static int32_t g_stop[8];
static int32_t g_n_stop;

typedef struct seq {
    int32_t ids[CTX + 8];
    int64_t n;
} seq;

/* ------------------------------------------------------------ the reference */

static int32_t argmax_known(const float *logits) {
    int32_t best = -1;
    for (int64_t i = 0; i < g_vocab; i++) {
        if (!og_tokenizer_token_text(g_tok, (int32_t)i)) continue;
        if (best < 0 || logits[i] > logits[best]) best = (int32_t)i;
    }
    return best;
}

static bool is_stop(int32_t t) {
    for (int32_t i = 0; i < g_n_stop; i++)
        if (g_stop[i] == t) return true;
    return false;
}

/* Greedy tokens after prompt [n] (at most max; until the context is full),
 * and when lp the log-probability of each. */
static void reference(const int32_t *prompt, int64_t n, int64_t max, seq *out, float *lp) {
    out->n = 0;
    og_session *s = NULL;
    CHECK_OK(og_session_create(g_model, NULL, &s));
    float *logits = malloc(sizeof(float) * (size_t)g_vocab);
    if (!s || !logits) goto done;
    CHECK_OK(og_session_eval(s, prompt, n, CHUNK, logits, 0));
    while (out->n < max) {
        int32_t t = argmax_known(logits);
        if (is_stop(t)) break;
        if (lp) {
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < g_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
            for (int64_t i = 0; i < g_vocab; i++) sum += exp((double)logits[i] - mx);
            lp[out->n] = (float)((double)logits[t] - mx - log(sum));
        }
        out->ids[out->n++] = t;
        if (out->n == max || og_session_length(s) >= CTX) break;
        if (og_session_eval(s, &t, 1, 1, logits, 0) != OG_OK) {
            CHECK_MSG(0, "reference step: %s", og_last_error());
            break;
        }
    }
done:
    free(logits);
    og_session_destroy(s);
}

static void encode(const char *text, seq *out) {
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenize(g_tok, text, strlen(text), OG_TOKENIZE_ADD_SPECIAL | OG_TOKENIZE_PARSE_SPECIAL, &ids, &n));
    out->n = n < CTX + 8 ? n : 0;
    if (ids) memcpy(out->ids, ids, (size_t)out->n * sizeof *ids);
    og_free(ids);
}

/* ------------------------------------------------------------ helpers */

/* An engine over the test model with ep (NULL, the failure counted, when
 * it cannot be made). */
static og_engine *new_engine(const og_engine_params *ep) {
    og_engine *e = NULL;
    CHECK_OK(og_engine_create(g_model, g_tok, ep, &e));
    return e;
}

typedef struct result {
    og_status submit;
    seq tokens;
    char text[4096];
    size_t n_text;
    float lp[CTX];
    int32_t n_lp;
    og_request_output last;
} result;

/* Reads r to its end into res (tokens, text, logprobs, the last output). */
static void drain(og_request *r, result *res) {
    res->tokens.n = 0;
    res->n_text = 0;
    res->n_lp = 0;
    for (int guard = 0; guard < 100000; guard++) {
        og_request_output o;
        CHECK_OK(og_request_next(r, &o, -1));
        for (int32_t i = 0; i < o.n_tokens && res->tokens.n < CTX + 8; i++) res->tokens.ids[res->tokens.n++] = o.tokens[i];
        for (int32_t i = 0; i < o.n_logprobs && res->n_lp < CTX; i++) {
            CHECK(o.logprobs[i].token == o.tokens[i]);
            res->lp[res->n_lp++] = o.logprobs[i].logprob;
        }
        if (res->n_text + o.n_text < sizeof res->text) {
            memcpy(res->text + res->n_text, o.text, o.n_text);
            res->n_text += o.n_text;
        }
        res->text[res->n_text] = 0;
        res->last = o;
        if (o.finish != OG_FINISH_NONE) return;
    }
    CHECK_MSG(0, "a request never ended");
}

static og_request_params text_params(const char *text, int64_t max_tokens) {
    og_request_params p = og_request_default_params();
    p.kind = OG_PROMPT_TEXT;
    p.text = text;
    p.sampling.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
}

static og_request_params token_params(const int32_t *ids, int64_t n, int64_t max_tokens) {
    og_request_params p = og_request_default_params();
    p.kind = OG_PROMPT_TOKENS;
    p.tokens = ids;
    p.n_tokens = n;
    p.sampling.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
}

static void run(og_engine *e, const og_request_params *p, result *res) {
    og_request *r = NULL;
    res->submit = og_engine_submit(e, p, &r);
    CHECK_MSG(res->submit == OG_OK, "submit: %s (%s)", og_status_str(res->submit), og_last_error());
    if (r) drain(r, res);
    og_request_destroy(r);
}

static bool same(const seq *a, const seq *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids);
}

static og_engine_params params(void) {
    og_engine_params p = og_engine_default_params();
    p.chunk = CHUNK;
    p.seed = 7;
    return p;
}

/* A metric's value from og_engine_metrics_text (-1 when absent). */
static double metric(og_engine *e, const char *name) {
    char *t = og_engine_metrics_text(e);
    double v = -1;
    size_t k = strlen(name);
    for (const char *l = t; l && *l;) {
        if (!strncmp(l, name, k) && l[k] == ' ') v = atof(l + k + 1);
        const char *nl = strchr(l, '\n');
        l = nl ? nl + 1 : NULL;
    }
    og_free(t);
    return v;
}

/* Waits (at most 10 s) until the metric reaches want. */
static bool metric_becomes(og_engine *e, const char *name, double want) {
    for (int i = 0; i < 1000; i++) {
        if (metric(e, name) == want) return true;
        usleep(10000);
    }
    return false;
}

static const char *const g_prompts[] = {
    "And it came to pass", "In the beginning God created", "And the LORD said unto Moses",
    "Blessed are the poor in spirit", "And the king of Egypt", "Now these are the generations of",
    "The LORD is my shepherd", "And Jacob went out from Beersheba",
};
#define N_PROMPTS 8

/* ------------------------------------------------------------ the tests */

static void test_greedy(og_engine *e) {
    og_test_section("greedy text requests give the reference's tokens, text and logprobs");
    for (int i = 0; i < 3; i++) {
        seq prompt, want;
        encode(g_prompts[i], &prompt);
        float lp[CTX];
        reference(prompt.ids, prompt.n, 24, &want, lp);
        og_request_params p = text_params(g_prompts[i], 24);
        p.logprobs = 3;
        result res;
        run(e, &p, &res);
        CHECK_MSG(same(&res.tokens, &want), "prompt %d: %lld tokens, reference %lld", i, (long long)res.tokens.n,
                  (long long)want.n);
        CHECK(res.last.prompt_tokens == prompt.n);
        CHECK(res.last.completion_tokens == want.n);
        CHECK(res.last.finish == (want.n == 24 ? OG_FINISH_LENGTH : OG_FINISH_STOP));
        CHECK(res.n_lp == want.n);
        double worst = 0;
        for (int32_t k = 0; k < res.n_lp && k < want.n; k++)
            worst = fabs(res.lp[k] - lp[k]) > worst ? fabs(res.lp[k] - lp[k]) : worst;
        CHECK_MSG(worst < 1e-4, "logprobs differ by %g", worst);
        char *text = NULL;
        CHECK_OK(og_detokenize(g_tok, want.ids, want.n, &text, NULL));
        CHECK_MSG(text && !strcmp(text, res.text), "text '%s', decode of the reference '%s'", res.text,
                  text ? text : "");
        og_free(text);
        CHECK(res.last.t_submit > 0 && res.last.t_first_token >= res.last.t_submit &&
              res.last.t_last_token >= res.last.t_first_token && res.last.t_end >= res.last.t_last_token);
    }

    og_test_section("a stop string ends the text before it; the same tokens as a token prompt");
    seq prompt, want;
    encode(g_prompts[0], &prompt);
    reference(prompt.ids, prompt.n, 24, &want, NULL);
    char *full = NULL;
    CHECK_OK(og_detokenize(g_tok, want.ids, want.n, &full, NULL));
    if (full && strlen(full) > 12) {
        char stop[5];
        memcpy(stop, full + 8, 4);
        stop[4] = 0;
        const char *stops[] = {stop};
        og_request_params p = token_params(prompt.ids, prompt.n, 24);
        p.stop = stops;
        p.n_stop = 1;
        result res;
        run(e, &p, &res);
        char *at = strstr(full, stop);
        CHECK(at && res.n_text == (size_t)(at - full) && !strncmp(res.text, full, res.n_text));
        CHECK(res.last.finish == OG_FINISH_STOP);
    }
    og_free(full);
}

static void test_prefix(og_engine *e) {
    og_test_section("prefix hits: the same prompt again reuses it and gives the cold tokens");
    const char *text = "And it came to pass in the days of the judges, that there was a famine in the land. "
                       "And a certain man went to sojourn in the country of Moab";
    seq prompt, want;
    encode(text, &prompt);
    CHECK(prompt.n > 2 * 16);
    reference(prompt.ids, prompt.n, 16, &want, NULL);
    const double hits0 = metric(e, "offgraph_prefix_cache_hits_total");
    result cold, warm;
    og_request *none = NULL;
    og_request_params empty = text_params("", 4);
    empty.add_special = false;
    CHECK_STATUS(og_engine_submit(e, &empty, &none), OG_ERR_INVALID_ARGUMENT);
    og_request_params c = token_params(prompt.ids, prompt.n, 16);
    run(e, &c, &cold);
    og_request_params p = text_params(text, 16);
    run(e, &p, &warm);
    CHECK(same(&cold.tokens, &want));
    CHECK(same(&warm.tokens, &want));
    CHECK_MSG(warm.last.reused_tokens >= 16 && warm.last.reused_tokens < prompt.n, "reused %lld of %lld",
              (long long)warm.last.reused_tokens, (long long)prompt.n);
    CHECK(metric(e, "offgraph_prefix_cache_hits_total") == hits0 + 1);

    og_test_section("prefix hits: a prompt that extends a cached one");
    char longer[512];
    snprintf(longer, sizeof longer, "%s, he, and his wife, and his two sons.", text);
    seq p2, want2;
    encode(longer, &p2);
    reference(p2.ids, p2.n, 12, &want2, NULL);
    result ext;
    og_request_params q = text_params(longer, 12);
    run(e, &q, &ext);
    CHECK(same(&ext.tokens, &want2));
    CHECK(ext.last.reused_tokens >= 16);
}

/* The smallest budget under which a fresh session reaches `tokens` tokens. */
static int64_t budget_for(int64_t tokens) {
    og_session *s = NULL;
    CHECK_OK(og_session_create(g_model, NULL, &s));
    int64_t lo = 0, hi = 1 << 24;
    og_kv_capacity c;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (og_kv_session_capacity(og_session_kv(s), mid, &c) == OG_OK && c.tokens_reachable >= tokens) hi = mid;
        else lo = mid;
    }
    og_session_destroy(s);
    return hi;
}

static void test_budget(void) {
    og_test_section("admission under a KV budget: one request at a time");
    og_engine_params ep = params();
    ep.prefix_cache_bytes = 0;
    ep.max_sessions = 4;
    ep.max_queue = 8;
    const int64_t one = budget_for(CTX / 2);
    ep.kv_budget = one + one / 2; /* one request of CTX/2 tokens, never two */
    ep.test_step_delay_s = 0.002;
    og_engine *e = new_engine(&ep);
    if (!e) return;
    og_request *r[3] = {0};
    seq prompt[3], want[3];
    for (int i = 0; i < 3; i++) {
        encode(g_prompts[i], &prompt[i]);
        reference(prompt[i].ids, prompt[i].n, CTX / 2 - prompt[i].n, &want[i], NULL);
        og_request_params p = text_params(g_prompts[i], CTX / 2 - prompt[i].n);
        p.ignore_eos = false;
        CHECK_OK(og_engine_submit(e, &p, &r[i]));
    }
    CHECK(metric(e, "offgraph_requests_running") <= 1);
    result res[3];
    for (int i = 0; i < 3; i++) {
        if (!r[i]) continue;
        drain(r[i], &res[i]);
        CHECK_MSG(same(&res[i].tokens, &want[i]), "request %d under the budget: other tokens", i);
        og_request_destroy(r[i]);
    }
    /* first come, first served, and never two at once */
    for (int i = 1; i < 3; i++)
        CHECK_MSG(res[i].last.t_first_token >= res[i - 1].last.t_end, "request %d started before %d ended", i, i - 1);

    og_test_section("a request larger than the whole budget, a prompt past the context: refused by name");
    og_engine_destroy(e);
    ep.kv_budget = one; /* CTX/2 tokens, not CTX */
    CHECK_OK(og_engine_create(g_model, g_tok, &ep, &e));
    if (!e) return;
    og_request *x = NULL;
    og_request_params big = text_params(g_prompts[0], CTX);
    CHECK_STATUS(og_engine_submit(e, &big, &x), OG_ERR_CAPACITY);
    CHECK(x == NULL && strstr(og_last_error(), "kv_budget"));
    /* max_tokens 0: as many as the budget allows one request, never refused */
    og_request_params all = text_params(g_prompts[0], 0);
    all.ignore_eos = true;
    result r0;
    run(e, &all, &r0);
    CHECK(r0.last.finish == OG_FINISH_LENGTH && r0.last.completion_tokens >= 1 &&
          r0.last.completion_tokens + r0.last.prompt_tokens <= CTX);
    og_engine_destroy(e);

    CHECK_OK(og_engine_create(g_model, g_tok, NULL, &e));
    if (!e) return;
    char *longtext = malloc(CTX * 24);
    longtext[0] = 0;
    for (int i = 0; i < CTX; i++) strcat(longtext, "And it came to pass ");
    og_request_params lp = text_params(longtext, 4);
    CHECK_STATUS(og_engine_submit(e, &lp, &x), OG_ERR_CAPACITY);
    CHECK(strstr(og_last_error(), "context length is 256"));
    free(longtext);
    /* max_tokens past the context: it ends there, finish length */
    seq prompt0, want0;
    encode(g_prompts[0], &prompt0);
    og_request_params past = token_params(prompt0.ids, prompt0.n, 5000);
    past.ignore_eos = true;
    result rp;
    run(e, &past, &rp);
    CHECK(rp.last.finish == OG_FINISH_LENGTH && rp.last.completion_tokens == CTX - prompt0.n + 1);
    (void)want0;
    og_engine_destroy(e);
}

static void test_queue_and_cancel(void) {
    og_test_section("a full queue is refused; a waiting request is cancelled; cancellation mid-generation");
    og_engine_params ep = params();
    ep.max_sessions = 1;
    ep.max_queue = 1;
    ep.test_step_delay_s = 0.005;
    og_engine *e = new_engine(&ep);
    if (!e) return;
    og_request_params p = text_params(g_prompts[0], 200);
    p.ignore_eos = true;
    og_request *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(og_engine_submit(e, &p, &a));
    CHECK_OK(og_engine_submit(e, &p, &b));
    CHECK_STATUS(og_engine_submit(e, &p, &c), OG_ERR_BUSY);
    CHECK(c == NULL);
    CHECK(metric(e, "offgraph_requests_total{outcome=\"rejected\"}") == 1);
    /* b waits: cancelled, it ends at once and frees its place */
    og_request_cancel(b);
    og_request_output o;
    CHECK_OK(og_request_next(b, &o, 5));
    CHECK(o.finish == OG_FINISH_CANCELLED && o.completion_tokens == 0);
    og_request_destroy(b);
    CHECK_OK(og_engine_submit(e, &p, &c));
    /* a generates: some tokens, then cancel from here while steps run */
    int64_t got = 0;
    while (a && got < 5) {
        CHECK_OK(og_request_next(a, &o, 5));
        got += o.n_tokens;
        if (o.finish != OG_FINISH_NONE) break;
    }
    og_request_cancel(a);
    result ra;
    if (a) drain(a, &ra);
    CHECK(ra.last.finish == OG_FINISH_CANCELLED && ra.last.completion_tokens < 200);
    og_request_destroy(a);
    /* c runs now (a's session freed), and is destroyed mid-generation */
    CHECK_OK(og_request_next(c, &o, 10));
    og_request_destroy(c);
    CHECK(metric_becomes(e, "offgraph_requests_running", 0));
    CHECK(metric_becomes(e, "offgraph_sessions_busy", 0));
    CHECK(metric(e, "offgraph_requests_total{outcome=\"cancelled\"}") == 3);

    og_test_section("og_engine_stop: waiting and running requests end with OG_ERR_STATE, then submits are refused");
    CHECK_OK(og_engine_submit(e, &p, &a));
    CHECK_OK(og_engine_submit(e, &p, &b));
    og_engine_stop(e, 0.05);
    result r1, r2;
    drain(a, &r1);
    drain(b, &r2);
    CHECK(r1.last.finish == OG_FINISH_ERROR && r1.last.status == OG_ERR_STATE && r1.last.error[0]);
    CHECK(r2.last.finish == OG_FINISH_ERROR && r2.last.status == OG_ERR_STATE);
    CHECK_STATUS(og_engine_submit(e, &p, &c), OG_ERR_STATE);
    og_request_destroy(a);
    og_request_destroy(b);
    og_engine_destroy(e);
}

static void test_fairness(void) {
    og_test_section("fairness: short requests behind a long prompt finish before it draws its first token");
    og_engine_params ep = params();
    ep.chunk = 16;
    ep.step_rows = 32;
    ep.prefix_cache_bytes = 0;
    ep.test_step_delay_s = 0.01;
    og_engine *e = new_engine(&ep);
    if (!e) return;
    int32_t longp[200];
    og_rng rng = og_rng_seed(5);
    for (int i = 0; i < 200; i++) longp[i] = 10 + (int32_t)(og_rng_next(&rng) % 200);
    og_request_params lp = token_params(longp, 200, 40);
    lp.ignore_eos = true;
    og_request *l = NULL, *s[3] = {0};
    CHECK_OK(og_engine_submit(e, &lp, &l));
    for (int i = 0; i < 3; i++) {
        og_request_params sp = text_params(g_prompts[i], 4);
        sp.ignore_eos = true;
        CHECK_OK(og_engine_submit(e, &sp, &s[i]));
    }
    result rl, rs[3];
    for (int i = 0; i < 3; i++)
        if (s[i]) drain(s[i], &rs[i]);
    if (l) drain(l, &rl);
    for (int i = 0; i < 3; i++) {
        CHECK(rs[i].last.completion_tokens == 4);
        CHECK_MSG(rs[i].last.t_end < rl.last.t_first_token, "short %d ended %.3f s after the long one's first token",
                  i, rs[i].last.t_end - rl.last.t_first_token);
        og_request_destroy(s[i]);
    }
    CHECK(rl.last.completion_tokens == 40);
    og_request_destroy(l);
    og_engine_destroy(e);
}

typedef struct thread_arg {
    og_engine *e;
    int id;
    seq *want;
    int bad;
} thread_arg;

static void *submitter(void *p) {
    thread_arg *a = p;
    for (int k = 0; k < 4; k++) {
        int i = (a->id + k) % N_PROMPTS;
        og_request_params q = text_params(g_prompts[i], 6 + i);
        og_request *r = NULL;
        if (og_engine_submit(a->e, &q, &r) != OG_OK) {
            a->bad++;
            continue;
        }
        seq got = {.n = 0};
        for (;;) {
            og_request_output o;
            og_request_next(r, &o, -1);
            for (int32_t j = 0; j < o.n_tokens && got.n < CTX; j++) got.ids[got.n++] = o.tokens[j];
            if (o.finish != OG_FINISH_NONE) break;
        }
        if (!same(&got, &a->want[i])) a->bad++;
        og_request_destroy(r);
    }
    return NULL;
}

static void test_threads(og_engine *e) {
    og_test_section("8 threads submitting at once: every output is the reference's");
    static seq want[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        seq prompt;
        encode(g_prompts[i], &prompt);
        reference(prompt.ids, prompt.n, 6 + i, &want[i], NULL);
    }
    pthread_t th[8];
    thread_arg args[8];
    for (int t = 0; t < 8; t++) {
        args[t] = (thread_arg){e, t, want, 0};
        pthread_create(&th[t], NULL, submitter, &args[t]);
    }
    int bad = 0;
    for (int t = 0; t < 8; t++) {
        pthread_join(th[t], NULL);
        bad += args[t].bad;
    }
    CHECK_MSG(bad == 0, "%d of 32 requests differ from the reference", bad);
}

/* A constraint that allows only the ids of its sequence, in order. */
typedef struct forced {
    const int32_t *ids;
    int64_t n;
    int calls;
} forced;
static void force(void *ctx, const int32_t *generated, int64_t n, float *logits, int64_t vocab) {
    forced *f = ctx;
    f->calls++;
    int32_t want = n < f->n ? f->ids[n] : 0;
    for (int64_t i = 0; i < n && i < f->n; i++)
        if (generated[i] != f->ids[i]) want = 0; /* a history it did not force */
    for (int64_t i = 0; i < vocab; i++)
        if (i != want) logits[i] = -INFINITY;
}

static void test_constraint_and_tokens(og_engine *e) {
    og_test_section("the constraint hook decides every draw");
    seq prompt, free_run;
    encode(g_prompts[1], &prompt);
    reference(prompt.ids, prompt.n, 6, &free_run, NULL);
    int32_t ids[6];
    for (int i = 0; i < 6; i++) ids[i] = free_run.n > 0 ? (free_run.ids[0] + 1 + i) % 200 + 10 : 11 + i;
    forced f = {ids, 6, 0};
    og_request_params p = token_params(prompt.ids, prompt.n, 6);
    p.ignore_eos = true;
    p.constraint = force;
    p.constraint_ctx = &f;
    result res;
    run(e, &p, &res);
    seq want = {.n = 6};
    memcpy(want.ids, ids, sizeof ids);
    CHECK(same(&res.tokens, &want));
    CHECK(f.calls == 6);

    og_test_section("an engine without a tokenizer: token prompts, no text");
    og_engine *bare = NULL;
    CHECK_OK(og_engine_create(g_model, NULL, NULL, &bare));
    if (!bare) return;
    og_request *r = NULL;
    og_request_params t = text_params("x", 2);
    CHECK_STATUS(og_engine_submit(bare, &t, &r), OG_ERR_INVALID_ARGUMENT);
    og_request_params k = token_params(prompt.ids, prompt.n, 5);
    seq want5;
    reference(prompt.ids, prompt.n, 5, &want5, NULL);
    run(bare, &k, &res);
    /* no stop ids without a tokenizer: five tokens, the reference's up to its stop */
    CHECK(res.tokens.n == 5 && res.n_text == 0 && res.last.finish == OG_FINISH_LENGTH);
    CHECK(res.tokens.n >= want5.n && !memcmp(res.tokens.ids, want5.ids, (size_t)want5.n * sizeof(int32_t)));
    int32_t badid = (int32_t)g_vocab;
    og_request_params kb = token_params(&badid, 1, 2);
    CHECK_STATUS(og_engine_submit(bare, &kb, &r), OG_ERR_INVALID_ARGUMENT);
    og_engine_destroy(bare);
}

/* ------------------------------------------------------------ a caller's session */

/* The oracle of a turn in a caller's session: a plain session loop that
 * feeds prompt [n] (in the engine's chunks), then draws greedily, feeding
 * every token drawn (the last one too) until a stop id (not fed), max
 * tokens, or a full session (the token that cannot be fed is not taken). */
static void ref_turn(og_session *s, const int32_t *prompt, int64_t n, int64_t max, seq *out) {
    out->n = 0;
    float *logits = malloc(sizeof(float) * (size_t)g_vocab);
    if (!logits) return;
    CHECK_OK(og_session_eval(s, prompt, n, CHUNK, logits, 0));
    while (out->n < max && og_session_length(s) < CTX) {
        int32_t t = argmax_known(logits);
        if (is_stop(t)) break;
        out->ids[out->n++] = t;
        if (og_session_eval(s, &t, 1, 1, logits, 0) != OG_OK) {
            CHECK_MSG(0, "reference step: %s", og_last_error());
            break;
        }
    }
    free(logits);
}

/* Tokens of text with nothing added (a turn after the first). */
static void encode_plain(const char *text, seq *out) {
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenize(g_tok, text, strlen(text), OG_TOKENIZE_PARSE_SPECIAL, &ids, &n));
    out->n = n < CTX + 8 ? n : 0;
    if (ids) memcpy(out->ids, ids, (size_t)out->n * sizeof *ids);
    og_free(ids);
}

/* A request of text (its ids, no added tokens, into *ids) that goes on in
 * the caller's session s until the context is full or it is cancelled. */
static og_request_params on_session(og_session *s, const char *text, seq *ids) {
    encode_plain(text, ids);
    og_request_params p = token_params(ids->ids, ids->n, 0);
    p.session = s;
    p.ignore_eos = true;
    return p;
}

/* og_engine_render: the text a chat request renders is the prompt it
 * reads: the same request as those ids (tokenized as a chat's text is, its
 * special tokens parsed) gives the same prompt and the same tokens. */
static void test_render(og_engine *e) {
    og_test_section("og_engine_render: the prompt text a chat request reads");
    const og_chat_message msgs[] = {{"system", "Be brief."}, {"user", "In the beginning"}};
    og_request_params p = og_request_default_params();
    p.kind = OG_PROMPT_CHAT;
    p.messages = msgs;
    p.n_messages = 2;
    p.sampling.temperature = 0;
    p.max_tokens = 6;
    p.ignore_eos = true;
    char *text = NULL;
    CHECK_OK(og_engine_render(e, &p, &text));
    if (!text) return;
    CHECK(strstr(text, "In the beginning") && strstr(text, "Be brief."));
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK_OK(og_tokenize(g_tok, text, strlen(text), OG_TOKENIZE_PARSE_SPECIAL, &ids, &n));
    result chat, toks;
    run(e, &p, &chat);
    og_request_params q = token_params(ids, n, 6);
    q.ignore_eos = true;
    run(e, &q, &toks);
    CHECK_MSG(chat.last.prompt_tokens == n && toks.last.prompt_tokens == n && same(&chat.tokens, &toks.tokens),
              "the chat read %lld tokens, its rendering %lld", (long long)chat.last.prompt_tokens, (long long)n);
    og_free(ids);
    /* without a generation prompt it renders too (this model has no chat
     * template: the plain fallback has no generation prompt, so the text is
     * the same); refusals */
    const size_t with_prompt = strlen(text);
    og_free(text);
    p.add_generation_prompt = false;
    CHECK_OK(og_engine_render(e, &p, &text));
    CHECK(text && strlen(text) == with_prompt);
    og_free(text);
    og_request_params t = text_params("x", 1);
    text = (char *)1;
    CHECK_STATUS(og_engine_render(e, &t, &text), OG_ERR_INVALID_ARGUMENT);
    CHECK(text == NULL);
    p.n_messages = 0;
    CHECK_STATUS(og_engine_render(e, &p, &text), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_engine_render(e, NULL, &text), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_engine_render(e, &p, NULL), OG_ERR_INVALID_ARGUMENT);
}

static void test_own_session(og_engine *e) {
    og_test_section("a caller's session: turns give a plain loop's tokens and the session holds them");
    og_session *mine = NULL, *ref = NULL;
    CHECK_OK(og_session_create(g_model, NULL, &mine));
    CHECK_OK(og_session_create(g_model, NULL, &ref));
    if (!mine || !ref) goto done;
    const char *turns[] = {"And it came to pass", " that the LORD spake unto Moses", "\nAnd Moses said"};
    for (int k = 0; k < 3; k++) {
        seq prompt, want;
        if (k == 0) encode(turns[k], &prompt);
        else encode_plain(turns[k], &prompt);
        const int64_t before = og_session_length(mine);
        ref_turn(ref, prompt.ids, prompt.n, 12, &want);
        og_request_params p = token_params(prompt.ids, prompt.n, 12);
        p.session = mine;
        result res;
        run(e, &p, &res);
        CHECK_MSG(same(&res.tokens, &want), "turn %d: %lld tokens, the plain loop's %lld", k,
                  (long long)res.tokens.n, (long long)want.n);
        CHECK(res.last.reused_tokens == 0 && res.last.prompt_tokens == prompt.n);
        /* the last token was given out a step before the end: the step that fed it */
        CHECK_MSG(res.last.t_last_token >= res.last.t_first_token && res.last.t_end > res.last.t_last_token,
                  "turn %d: first token %.6f, last %.6f, end %.6f", k, res.last.t_first_token, res.last.t_last_token,
                  res.last.t_end);
        CHECK_MSG(og_session_length(mine) == before + prompt.n + res.tokens.n && og_session_length(mine) ==
                                                                                      og_session_length(ref),
                  "turn %d: the session holds %lld, want %lld + %lld + %lld", k, (long long)og_session_length(mine),
                  (long long)before, (long long)prompt.n, (long long)res.tokens.n);
        CHECK(res.last.kv.bytes_live > 0);
    }
    og_test_section("a caller's session: the rows it holds are the plain loop's (the next logits agree)");
    {
        const int32_t probe = 11;
        float *a = malloc(sizeof(float) * (size_t)g_vocab), *b = malloc(sizeof(float) * (size_t)g_vocab);
        og_session *fa = NULL, *fb = NULL;
        CHECK_OK(og_session_fork(mine, og_session_length(mine), &fa));
        CHECK_OK(og_session_fork(ref, og_session_length(ref), &fb));
        if (a && b && fa && fb) {
            CHECK_OK(og_session_eval(fa, &probe, 1, 1, a, 0));
            CHECK_OK(og_session_eval(fb, &probe, 1, 1, b, 0));
            double worst = 0;
            for (int64_t i = 0; i < g_vocab; i++) worst = fabs(a[i] - b[i]) > worst ? fabs(a[i] - b[i]) : worst;
            CHECK_MSG(worst == 0, "logits differ by %g", worst);
        }
        og_session_destroy(fa);
        og_session_destroy(fb);
        free(a);
        free(b);
    }

    og_test_section("a caller's session: a second request on it while one runs is refused");
    {
        seq more;
        const int64_t before = og_session_length(mine);
        /* the first runs until cancelled (to the context at most): the
         * second comes while it runs, however slow the machine */
        og_request_params p = on_session(mine, " and", &more);
        og_request *r1 = NULL, *r2 = NULL;
        CHECK_OK(og_engine_submit(e, &p, &r1));
        og_status st = og_engine_submit(e, &p, &r2);
        CHECK_MSG(st == OG_ERR_INVALID_ARGUMENT && r2 == NULL, "a second request: %s", og_status_str(st));
        og_request_destroy(r2);
        og_request_cancel(r1);
        result res;
        if (r1) drain(r1, &res);
        og_request_destroy(r1);
        /* cancelled at once: perhaps before its prompt was read */
        const int64_t L = og_session_length(mine);
        CHECK_MSG(res.last.completion_tokens ? L == before + more.n + res.last.completion_tokens
                                             : L >= before && L <= before + more.n,
                  "the session holds %lld after %lld tokens", (long long)L, (long long)res.last.completion_tokens);
        og_session_reset(mine); /* the next section starts it over */
    }

    og_test_section("a caller's session: max_tokens 0 fills it to the context, every token given out fed");
    {
        seq more;
        const int64_t before = og_session_length(mine);
        og_request_params p = on_session(mine, " And the", &more);
        result res;
        run(e, &p, &res);
        CHECK(res.last.finish == OG_FINISH_LENGTH);
        CHECK_MSG(res.tokens.n == CTX - before - more.n && og_session_length(mine) == CTX,
                  "%lld tokens given out, the session holds %lld (held %lld, prompt %lld, context %d)",
                  (long long)res.tokens.n, (long long)og_session_length(mine), (long long)before, (long long)more.n,
                  CTX);
        og_request *r = NULL;
        og_request_params q = token_params(more.ids, 1, 2);
        q.session = mine;
        CHECK_STATUS(og_engine_submit(e, &q, &r), OG_ERR_CAPACITY);
        CHECK(strstr(og_last_error(), "the session holds") != NULL);
    }

    og_test_section("a caller's session: cancelled or destroyed mid-reply, it holds every token given out");
    og_session_reset(mine);
    for (int destroy = 0; destroy < 2; destroy++) {
        seq prompt;
        encode(g_prompts[2], &prompt);
        const int64_t before = og_session_length(mine);
        og_request_params p = token_params(prompt.ids, prompt.n, 0);
        p.session = mine;
        p.ignore_eos = true;
        og_request *r = NULL;
        CHECK_OK(og_engine_submit(e, &p, &r));
        if (!r) continue;
        int64_t got = 0;
        og_request_output o;
        for (int guard = 0; guard < 10000 && got < 3; guard++) {
            CHECK_OK(og_request_next(r, &o, -1));
            got += o.n_tokens;
            if (o.finish != OG_FINISH_NONE) break;
        }
        if (destroy) {
            og_request_destroy(r); /* returns once the session is the caller's again */
            CHECK_MSG(og_session_length(mine) >= before + prompt.n + got, "destroyed: the session holds %lld",
                      (long long)og_session_length(mine));
            continue;
        }
        og_request_cancel(r);
        result rest;
        drain(r, &rest);
        got += rest.tokens.n;
        CHECK(rest.last.finish == OG_FINISH_CANCELLED);
        CHECK(rest.last.completion_tokens == got);
        CHECK_MSG(og_session_length(mine) == before + prompt.n + got, "cancelled: the session holds %lld, want %lld",
                  (long long)og_session_length(mine), (long long)(before + prompt.n + got));
        og_request_destroy(r);
    }
    {
        /* still the caller's to use: the engine took it back */
        int32_t t = 11;
        CHECK_OK(og_session_eval(mine, &t, 1, 1, NULL, 0));
    }
done:
    og_session_destroy(mine);
    og_session_destroy(ref);
}

static void test_choices(void) {
    og_test_section("n choices: one prefill; greedy choices are the reference's; sampled ones differ");
    og_engine_params ep = params();
    ep.prefix_cache_bytes = 0; /* every prompt token counted is one prefilled */
    og_engine *e = new_engine(&ep);
    if (!e) return;
    seq prompt, want;
    encode(g_prompts[6], &prompt);
    reference(prompt.ids, prompt.n, 12, &want, NULL);
    og_request *rs[4] = {0};
    og_request_params p = text_params(g_prompts[6], 12);
    CHECK_OK(og_engine_submit_n(e, &p, 3, NULL, rs));
    for (int i = 0; i < 3; i++) {
        result res;
        if (!rs[i]) continue;
        drain(rs[i], &res);
        CHECK_MSG(same(&res.tokens, &want) && res.last.prompt_tokens == prompt.n, "greedy choice %d", i);
        og_request_destroy(rs[i]);
    }
    CHECK_MSG(metric(e, "offgraph_prompt_tokens_total") == (double)prompt.n, "%g prompt tokens prefilled for %lld",
              metric(e, "offgraph_prompt_tokens_total"), (long long)prompt.n);

    /* sampled: choice 0 is the request alone with the same seed; the choices differ */
    og_request_params q = text_params(g_prompts[6], 16);
    q.sampling.temperature = 1.5f;
    q.sampling.top_k = 0;
    q.sampling.top_p = 1;
    q.sampling.min_p = 0;
    q.sampling.seed = 11;
    q.ignore_eos = true;
    result alone, choice[4];
    run(e, &q, &alone);
    CHECK_OK(og_engine_submit_n(e, &q, 4, NULL, rs));
    for (int i = 0; i < 4; i++) {
        choice[i].tokens.n = 0;
        if (rs[i]) drain(rs[i], &choice[i]);
        og_request_destroy(rs[i]);
    }
    CHECK_MSG(same(&choice[0].tokens, &alone.tokens), "sampled choice 0 is not the request alone with its seed");
    int distinct = 0;
    for (int i = 1; i < 4; i++) distinct += !same(&choice[i].tokens, &choice[0].tokens) && choice[i].tokens.n == 16;
    CHECK_MSG(distinct == 3, "%d of 3 other choices differ from choice 0", distinct);

    og_test_section("n choices: the first choice cancelled at once; the others read the prompt and finish");
    for (int round = 0; round < 3; round++) {
        CHECK_OK(og_engine_submit_n(e, &p, 3, NULL, rs));
        og_request_destroy(rs[0]);
        for (int i = 1; i < 3; i++) {
            result res;
            if (!rs[i]) continue;
            drain(rs[i], &res);
            CHECK_MSG(same(&res.tokens, &want), "round %d: choice %d after the first was cancelled", round, i);
            og_request_destroy(rs[i]);
        }
    }
    og_request **many = calloc((size_t)ep.max_sessions + 1, sizeof *many);
    if (many) CHECK_STATUS(og_engine_submit_n(e, &p, ep.max_sessions + 1, NULL, many), OG_ERR_INVALID_ARGUMENT);
    free(many);
    CHECK_STATUS(og_engine_submit_n(e, &p, 0, NULL, rs), OG_ERR_INVALID_ARGUMENT);
    og_engine_destroy(e);
}

int main(void) {
    char dir[] = "/tmp/og_test_engine_XXXXXX", path[512];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/kjv.ogp", dir);
    og_export_options o;
    og_export_default_options(&o);
    o.max_context = CTX;
    o.initial_capacity = 16; /* storage grows: budgets depend on the tokens */
    CHECK_OK(og_export_hf(OG_SOURCE_DIR "/models/kjv-tiny", path, &o, NULL));
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 2;
    CHECK_OK(og_model_load(path, &mp, &g_model));
    remove(path);
    rmdir(dir);
    if (!g_model) return og_test_finish();
    CHECK_OK(og_tokenizer_from_model(g_model, &g_tok));
    if (!g_tok) return og_test_finish();
    g_vocab = og_model_vocab_size(g_model);
    g_n_stop = og_tokenizer_stop_ids(g_tok, g_stop, 8);
    og_engine_params ep = params();
    og_engine *e = new_engine(&ep);
    if (e) {
        test_greedy(e);
        test_prefix(e);
        test_threads(e);
        test_constraint_and_tokens(e);
        test_own_session(e);
        test_render(e);
        og_engine_destroy(e);
    }
    test_budget();
    test_queue_and_cancel();
    test_fairness();
    test_choices();
    og_tokenizer_destroy(g_tok);
    og_model_destroy(g_model);
    return og_test_finish();
}
