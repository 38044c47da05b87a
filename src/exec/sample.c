/* Sampling (offgraph.h, exec/sample.h). Legend: V = vocabulary size, K = candidates kept. */
#include "exec/sample.h"

#include "core/core.h"

#include <math.h>
#include <stdlib.h>

typedef struct cand {
    int32_t id;
    float p; /* logit, then probability */
} cand;

struct og_sampler {
    og_sampler_params p;
    int64_t vocab;
    uint64_t rng;
    cand *c;          /* [V] scratch */
    int32_t *recent;  /* [repeat_last_n] ring of recent tokens */
    int32_t n_recent, head;
    uint32_t *forbidden; /* [ceil(V / 32)] bitmap, NULL until a token is forbidden */
    og_logit_bias *bias; /* [p.n_logit_bias], p.logit_bias points here */
    int32_t *count;      /* [V] times each token was drawn; NULL without penalties */
    int32_t *drawn;      /* [n_drawn] the distinct tokens drawn, for the penalties */
    int32_t n_drawn, cap_drawn;
};

og_sampler_params og_sampler_default_params(void) {
    return (og_sampler_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                               .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
}

/* splitmix64: a full-period generator whose state is one word. */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

og_status og_sampler_create(const og_sampler_params *p, int64_t vocab, og_sampler **out) {
    if (!p || !out || vocab < 1 || vocab > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_sampler_create: NULL argument or vocab %lld out of range",
                            (long long)vocab);
    if (!(p->top_p >= 0) || !(p->min_p >= 0) || !(p->repeat_penalty > 0) || p->repeat_last_n < 0)
        return og_set_error(OG_ERR_INVALID_ARGUMENT,
                            "og_sampler_create: top_p and min_p must be >= 0, repeat_penalty > 0, repeat_last_n >= 0");
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_sampler_create: a presence or frequency penalty is not finite");
    if (p->n_logit_bias < 0 || (p->n_logit_bias && !p->logit_bias))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_sampler_create: logit_bias NULL or a negative count");
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab || !isfinite(p->logit_bias[i].bias))
            return og_set_error(OG_ERR_INVALID_ARGUMENT,
                                "og_sampler_create: logit_bias %d: token %d outside [0, %lld) or a bias that is not "
                                "finite", (int)i, (int)p->logit_bias[i].token, (long long)vocab);
    *out = NULL;
    og_sampler *s = og_calloc(1, sizeof *s);
    if (!s) return og_set_error(OG_ERR_OUT_OF_MEMORY, "sampler: out of memory");
    s->p = *p;
    s->vocab = vocab;
    s->c = og_malloc((size_t)vocab * sizeof *s->c);
    s->recent = p->repeat_last_n ? og_malloc((size_t)p->repeat_last_n * sizeof *s->recent) : NULL;
    const bool penalties = p->presence_penalty != 0 || p->frequency_penalty != 0;
    s->count = penalties ? og_calloc((size_t)vocab, sizeof *s->count) : NULL;
    s->bias = p->n_logit_bias ? og_malloc((size_t)p->n_logit_bias * sizeof *s->bias) : NULL;
    if (!s->c || (p->repeat_last_n && !s->recent) || (penalties && !s->count) || (p->n_logit_bias && !s->bias)) {
        og_sampler_destroy(s);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "sampler: out of memory");
    }
    if (p->n_logit_bias) memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    s->p.logit_bias = s->bias;
    og_sampler_reset(s);
    *out = s;
    return OG_OK;
}

void og_sampler_destroy(og_sampler *s) {
    if (!s) return;
    og_free(s->c);
    og_free(s->recent);
    og_free(s->forbidden);
    og_free(s->bias);
    og_free(s->count);
    og_free(s->drawn);
    og_free(s);
}

void og_sampler_reset(og_sampler *s) {
    s->rng = s->p.seed;
    s->n_recent = s->head = 0;
    for (int32_t i = 0; i < s->n_drawn; i++) s->count[s->drawn[i]] = 0;
    s->n_drawn = 0;
}

void og_sampler_accept(og_sampler *s, int32_t token) {
    if (!s->p.repeat_last_n) return;
    s->recent[s->head] = token;
    s->head = (s->head + 1) % s->p.repeat_last_n;
    if (s->n_recent < s->p.repeat_last_n) s->n_recent++;
}

og_status og_sampler_forbid(og_sampler *s, int32_t token) {
    if (!s || token < 0 || token >= s->vocab)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_sampler_forbid: NULL sampler or token %d outside the vocabulary",
                            (int)token);
    if (!s->forbidden) {
        s->forbidden = og_calloc((size_t)(s->vocab + 31) / 32, sizeof *s->forbidden);
        if (!s->forbidden) return og_set_error(OG_ERR_OUT_OF_MEMORY, "og_sampler_forbid: out of memory");
    }
    s->forbidden[token / 32] |= 1u << (token % 32);
    return OG_OK;
}

const og_sampler_params *og_sampler_get_params(const og_sampler *s) { return &s->p; }
int64_t og_sampler_vocab(const og_sampler *s) { return s->vocab; }
const uint32_t *og_sampler_forbidden(const og_sampler *s) { return s->forbidden; }

int32_t og_sampler_recent(const og_sampler *s, const int32_t **ids) {
    *ids = s->recent;
    return s->n_recent;
}

double og_sampler_peek_uniform(const og_sampler *s) {
    uint64_t state = s->rng;
    return (double)(next_u64(&state) >> 11) * (1.0 / 9007199254740992.0);
}

bool og_sampler_host_only(const og_sampler *s) { return s->count || s->p.n_logit_bias; }

void og_sampler_commit(og_sampler *s, int32_t token) {
    if (s->p.temperature > 0) next_u64(&s->rng);
    og_sampler_accept(s, token);
    if (!s->count || token < 0 || token >= s->vocab) return;
    if (s->count[token]++ == 0) {
        if (s->n_drawn == s->cap_drawn) { /* at most V distinct tokens: the count stays in int32 */
            int32_t cap = s->cap_drawn ? 2 * s->cap_drawn : 64;
            int32_t *d = og_realloc(s->drawn, (size_t)cap * sizeof *d);
            if (!d) { /* without memory the token goes unpenalized, never wrongly */
                s->count[token] = 0;
                return;
            }
            s->drawn = d;
            s->cap_drawn = cap;
        }
        s->drawn[s->n_drawn++] = token;
    }
}

/* Most likely first; the lower id first on ties, so the order is total. */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Restores the min-heap order (worst candidate at the root) of c[0..k)
 * below position j. */
static void sift_down(cand *c, int64_t k, int64_t j) {
    for (;;) {
        int64_t l = 2 * j + 1, m = j;
        if (l < k && cand_cmp(&c[l], &c[m]) > 0) m = l;
        if (l + 1 < k && cand_cmp(&c[l + 1], &c[m]) > 0) m = l + 1;
        if (m == j) return;
        cand t = c[j];
        c[j] = c[m];
        c[m] = t;
        j = m;
    }
}

/* Moves the k best of c[0..n) to c[0..k), sorted. */
static void keep_best(cand *c, int64_t n, int64_t k) {
    if (k < n) {
        /* min-heap of the k best seen so far in c[0..k) */
        for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
        for (int64_t i = k; i < n; i++) {
            if (cand_cmp(&c[i], &c[0]) >= 0) continue; /* not better than the worst kept */
            c[0] = c[i];
            sift_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

int32_t og_sampler_sample(og_sampler *s, const float *logits) {
    const int64_t V = s->vocab;
    cand *c = s->c; /* [V] */
    for (int64_t i = 0; i < V; i++) c[i] = (cand){(int32_t)i, logits[i]};
    if (s->forbidden)
        for (int64_t i = 0; i < V; i++)
            if (s->forbidden[i / 32] >> (i % 32) & 1) c[i].p = -INFINITY;
    for (int32_t i = 0; i < s->p.n_logit_bias; i++) c[s->bias[i].token].p += s->bias[i].bias;
    if (s->p.repeat_penalty != 1.0f)
        for (int32_t i = 0; i < s->n_recent; i++) {
            int32_t t = s->recent[i];
            if (t < 0 || t >= V) continue;
            /* a token seen twice is penalized once */
            int seen = 0;
            for (int32_t j = 0; j < i && !seen; j++) seen = s->recent[j] == t;
            if (seen) continue;
            float x = c[t].p;
            c[t].p = x > 0 ? x / s->p.repeat_penalty : x * s->p.repeat_penalty;
        }
    for (int32_t i = 0; i < s->n_drawn; i++) {
        const int32_t t = s->drawn[i];
        c[t].p -= (float)s->count[t] * s->p.frequency_penalty + s->p.presence_penalty;
    }
    int32_t tok;
    if (s->p.temperature <= 0) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (c[i].p > c[best].p) best = i;
        tok = c[best].id;
    } else {
        int64_t k = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
        keep_best(c, V, k);
        /* softmax over the kept, at the temperature */
        double sum = 0, mx = c[0].p;
        for (int64_t i = 0; i < k; i++) sum += (c[i].p = (float)exp((c[i].p - mx) / s->p.temperature));
        for (int64_t i = 0; i < k; i++) c[i].p = (float)(c[i].p / sum);
        if (s->p.top_p < 1) {
            double mass = 0;
            int64_t n = 0;
            while (n < k && mass < s->p.top_p) mass += c[n++].p;
            k = n > 0 ? n : 1;
        }
        if (s->p.min_p > 0) {
            int64_t n = 1;
            while (n < k && c[n].p >= s->p.min_p * c[0].p) n++;
            k = n;
        }
        double total = 0;
        for (int64_t i = 0; i < k; i++) total += c[i].p;
        double r = og_sampler_peek_uniform(s) * total, acc = 0;
        tok = c[k - 1].id;
        for (int64_t i = 0; i < k; i++)
            if ((acc += c[i].p) > r) {
                tok = c[i].id;
                break;
            }
    }
    og_sampler_commit(s, tok);
    return tok;
}

void og_logits_mask(float *logits, int64_t V, const uint32_t *allowed) {
    for (int64_t w = 0; w * 32 < V; w++) {
        const uint32_t bits = allowed[w];
        if (bits == 0xFFFFFFFFu) continue;
        const int64_t base = w * 32, end = base + 32 < V ? base + 32 : V;
        for (int64_t i = base; i < end; i++)
            if (!(bits >> (i - base) & 1u)) logits[i] = -INFINITY;
    }
}
