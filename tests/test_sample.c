/* Sampler properties, each against a plain computation done here:
 * greedy is the arg-max; top-k, top-p and min-p never return a token
 * outside their set; plain sampling follows the softmax; the repetition
 * penalty demotes a recent token; a seed repeats a run; a forbidden token
 * draws as if its logit were -infinity (what callers did before the sampler
 * could forbid) and never comes out; logit bias and the presence and
 * frequency penalties draw what the formula's logits draw; the draw is
 * peeked, not spent, until og_sampler_commit. */
#include "harness.h"
#include "exec/sample.h"

#include <math.h>
#include <stdlib.h>

#define V 50

static og_sampler *make(og_sampler_params p) {
    og_sampler *s = NULL;
    CHECK_OK(og_sampler_create(&p, V, &s));
    return s;
}

static og_sampler_params plain(void) {
    og_sampler_params p = og_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    return p;
}

/* Softmax at temperature 1, in double. */
static void softmax(const float *x, double *p) {
    double mx = x[0], sum = 0;
    for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++) sum += (p[i] = exp(x[i] - mx));
    for (int i = 0; i < V; i++) p[i] /= sum;
}

/* How many tokens have a strictly larger value than x[i]. */
static int rank_of(const float *x, int i) {
    int r = 0;
    for (int j = 0; j < V; j++) r += x[j] > x[i];
    return r;
}

int main(void) {
    og_rng rng = og_rng_seed(7);
    float x[V];

    og_test_section("greedy is the arg-max");
    og_sampler_params p = plain();
    p.temperature = 0;
    og_sampler *s = make(p);
    int bad = 0;
    for (int row = 0; row < 200; row++) {
        og_rng_fill(&rng, x, V, -5, 5);
        int best = 0;
        for (int i = 1; i < V; i++) best = x[i] > x[best] ? i : best;
        bad += og_sampler_sample(s, x) != best;
    }
    CHECK_MSG(bad == 0, "%d rows did not give the arg-max", bad);
    og_sampler_destroy(s);

    og_test_section("top-k never leaves the k best");
    for (int k = 1; k <= 7; k += 3) {
        p = plain();
        p.temperature = 5.0f; /* flat, so every kept token gets drawn */
        p.top_k = k;
        s = make(p);
        int outside = 0, distinct = 0, seen[V] = {0};
        og_rng_fill(&rng, x, V, -1, 1);
        for (int d = 0; d < 3000; d++) {
            int t = og_sampler_sample(s, x);
            outside += rank_of(x, t) >= k;
            distinct += !seen[t]++;
        }
        CHECK_MSG(outside == 0, "top_k %d: %d draws outside the %d best", k, outside, k);
        CHECK_MSG(distinct == k, "top_k %d: drew %d distinct tokens", k, distinct);
        og_sampler_destroy(s);
    }

    og_test_section("plain sampling follows the softmax");
    double prob[V];
    og_rng_fill(&rng, x, V, -2, 2);
    softmax(x, prob);
    s = make(plain());
    int count[V] = {0};
    const int draws = 60000;
    for (int d = 0; d < draws; d++) count[og_sampler_sample(s, x)]++;
    double worst = 0;
    for (int i = 0; i < V; i++) {
        /* 5 standard deviations of a binomial count */
        double sd = sqrt(draws * prob[i] * (1 - prob[i])) + 1;
        double z = fabs(count[i] - draws * prob[i]) / sd;
        worst = z > worst ? z : worst;
    }
    CHECK_MSG(worst < 5, "a token's frequency is %.1f standard deviations from its probability", worst);
    og_sampler_destroy(s);

    og_test_section("top-p keeps the nucleus, min-p the likely");
    p = plain();
    p.top_p = 0.6f;
    s = make(p);
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < V; i++) /* by probability, descending (selection sort) */
        for (int j = i + 1; j < V; j++)
            if (prob[order[j]] > prob[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int in_nucleus[V] = {0};
    double mass = 0;
    for (int i = 0; i < V && mass < 0.6; i++) {
        in_nucleus[order[i]] = 1;
        mass += prob[order[i]];
    }
    bad = 0;
    for (int d = 0; d < 3000; d++) bad += !in_nucleus[og_sampler_sample(s, x)];
    CHECK_MSG(bad == 0, "top_p: %d draws outside the nucleus", bad);
    og_sampler_destroy(s);
    p = plain();
    p.min_p = 0.3f;
    s = make(p);
    bad = 0;
    for (int d = 0; d < 3000; d++) bad += prob[og_sampler_sample(s, x)] < 0.3 * prob[order[0]] - 1e-9;
    CHECK_MSG(bad == 0, "min_p: %d draws below min_p * p_max", bad);
    og_sampler_destroy(s);

    og_test_section("repetition penalty demotes a recent token");
    for (int i = 0; i < V; i++) x[i] = 0.1f * (float)(i % 5);
    x[3] = 2.0f;
    x[9] = 1.5f;
    p = plain();
    p.temperature = 0;
    s = make(p);
    CHECK(og_sampler_sample(s, x) == 3);
    og_sampler_destroy(s);
    p.repeat_penalty = 1.5f; /* 2.0 / 1.5 < 1.5 */
    s = make(p);
    og_sampler_accept(s, 3);
    CHECK(og_sampler_sample(s, x) == 9);
    og_sampler_reset(s);
    CHECK(og_sampler_sample(s, x) == 3);
    og_sampler_destroy(s);

    og_test_section("a seed repeats a run");
    p = og_sampler_default_params();
    p.seed = 1234;
    og_sampler *a = make(p), *b = make(p);
    p.seed = 99;
    og_sampler *c = make(p);
    int same = 1, differ = 0, first[300];
    og_rng rows = og_rng_seed(11);
    for (int d = 0; d < 300; d++) {
        og_rng_fill(&rows, x, V, -2, 2);
        int ta = og_sampler_sample(a, x), tb = og_sampler_sample(b, x), tc = og_sampler_sample(c, x);
        first[d] = ta;
        same &= ta == tb;
        differ += ta != tc;
    }
    CHECK(same);
    CHECK_MSG(differ > 0, "another seed gave the very same 300 tokens");
    og_sampler_reset(a); /* reseeds: the same rows give the same run again */
    rows = og_rng_seed(11);
    for (int d = 0; d < 300; d++) {
        og_rng_fill(&rows, x, V, -2, 2);
        same &= og_sampler_sample(a, x) == first[d];
    }
    CHECK(same);
    og_sampler_destroy(b);
    og_sampler_destroy(c);

    og_test_section("forbidden tokens are -infinity");
    p = og_sampler_default_params();
    p.seed = 77;
    p.repeat_penalty = 1.3f;
    og_sampler *f = make(p), *g = make(p);
    CHECK_OK(og_sampler_forbid(f, 0));
    CHECK_OK(og_sampler_forbid(f, V - 1));
    CHECK_OK(og_sampler_forbid(f, 17));
    CHECK_STATUS(og_sampler_forbid(f, V), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sampler_forbid(f, -1), OG_ERR_INVALID_ARGUMENT);
    og_sampler_accept(f, 17), og_sampler_accept(g, 17); /* penalized and forbidden */
    int agree = 0, drawn_forbidden = 0;
    rows = og_rng_seed(5);
    for (int d = 0; d < 500; d++) {
        og_rng_fill(&rows, x, V, -2, 2);
        x[17] = 4.0f; /* by far the most likely, were it allowed */
        const int tf = og_sampler_sample(f, x);
        x[0] = x[V - 1] = x[17] = -INFINITY;
        const int tg = og_sampler_sample(g, x);
        agree += tf == tg;
        drawn_forbidden += tf == 0 || tf == V - 1 || tf == 17;
    }
    CHECK_MSG(agree == 500 && drawn_forbidden == 0, "%d of 500 draws agree, %d forbidden drawn", agree,
              drawn_forbidden);
    og_sampler_reset(f); /* forbidding outlives a reset */
    for (int i = 0; i < V; i++) x[i] = i == 17 ? 9.0f : 0.0f;
    CHECK(og_sampler_sample(f, x) != 17);
    og_sampler_destroy(f);
    og_sampler_destroy(g);

    og_test_section("logit bias, presence and frequency penalties are OpenAI's formula");
    /* f applies them; g, a plain sampler with the same seed, draws from
     * logits changed here by the formula (bias added, then a token drawn n
     * times lowered by n * frequency + presence): the same tokens, draw by
     * draw, at a temperature and greedy */
    for (int greedy = 0; greedy < 2; greedy++) {
        const og_logit_bias lb[] = {{4, 3.0f}, {11, -100.0f}, {4, 0.5f}, {V - 1, 1.25f}};
        p = plain();
        p.temperature = greedy ? 0.0f : 1.3f;
        p.seed = 21;
        g = make(p);
        p.presence_penalty = 0.7f;
        p.frequency_penalty = 0.45f;
        p.logit_bias = lb;
        p.n_logit_bias = 4;
        f = make(p);
        int n_drawn[V] = {0};
        int agree_pf = 0, drew_banned = 0, distinct = 0;
        rows = og_rng_seed(31);
        for (int d = 0; d < 400; d++) {
            og_rng_fill(&rows, x, V, -1, 1);
            float y[V];
            for (int i = 0; i < V; i++) {
                float v = x[i];
                for (int k = 0; k < 4; k++)
                    if (lb[k].token == i) v += lb[k].bias;
                if (n_drawn[i]) v -= (float)n_drawn[i] * p.frequency_penalty + p.presence_penalty;
                y[i] = v;
            }
            const int tf = og_sampler_sample(f, x), tg = og_sampler_sample(g, y);
            agree_pf += tf == tg;
            drew_banned += tf == 11;
            distinct += n_drawn[tf]++ == 0;
        }
        CHECK_MSG(agree_pf == 400 && drew_banned == 0, "%s: %d of 400 draws agree with the formula, %d banned drawn",
                  greedy ? "greedy" : "sampled", agree_pf, drew_banned);
        /* greedy without penalties would draw the biased token 4 every time */
        CHECK_MSG(distinct > 3, "%s: only %d distinct tokens: the penalties did not act", greedy ? "greedy" : "sampled",
                  distinct);
        og_sampler_reset(f); /* forgets the counts: the first draw is the same again */
        og_sampler_reset(g);
        rows = og_rng_seed(31);
        og_rng_fill(&rows, x, V, -1, 1);
        float y0[V];
        for (int i = 0; i < V; i++) {
            y0[i] = x[i];
            for (int k = 0; k < 4; k++)
                if (lb[k].token == i) y0[i] += lb[k].bias;
        }
        CHECK(og_sampler_sample(f, x) == og_sampler_sample(g, y0));
        og_sampler_destroy(f);
        og_sampler_destroy(g);
    }
    /* prompt tokens (og_sampler_accept) are not counted by the penalties */
    p = plain();
    p.temperature = 0;
    p.presence_penalty = 2.0f;
    f = make(p);
    for (int i = 0; i < V; i++) x[i] = i == 7 ? 1.0f : 0.0f;
    og_sampler_accept(f, 7);
    CHECK(og_sampler_sample(f, x) == 7);  /* drawn once now: 1 - 2 < 0 */
    CHECK(og_sampler_sample(f, x) == 0);
    og_sampler_destroy(f);
    p = plain();
    const og_logit_bias out_of_range = {V, 1.0f}, not_finite = {2, NAN};
    p.logit_bias = &out_of_range;
    p.n_logit_bias = 1;
    CHECK_STATUS(og_sampler_create(&p, V, &b), OG_ERR_INVALID_ARGUMENT);
    p.logit_bias = &not_finite;
    CHECK_STATUS(og_sampler_create(&p, V, &b), OG_ERR_INVALID_ARGUMENT);
    p.n_logit_bias = 0;
    p.frequency_penalty = INFINITY;
    CHECK_STATUS(og_sampler_create(&p, V, &b), OG_ERR_INVALID_ARGUMENT);

    og_test_section("the draw is peeked, then spent by commit");
    p = og_sampler_default_params();
    p.seed = 3;
    f = make(p);
    g = make(p);
    const double u = og_sampler_peek_uniform(f);
    CHECK(u >= 0 && u < 1 && og_sampler_peek_uniform(f) == u);
    og_sampler_commit(f, 4);
    CHECK(og_sampler_peek_uniform(f) != u);
    og_rng_fill(&rng, x, V, -2, 2);
    og_sampler_sample(g, x); /* spends one draw too */
    CHECK(og_sampler_peek_uniform(f) == og_sampler_peek_uniform(g));
    og_sampler_destroy(f);
    og_sampler_destroy(g);

    og_test_section("bad parameters are refused");
    p = plain();
    p.top_p = -1;
    CHECK_STATUS(og_sampler_create(&p, V, &b), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_sampler_create(&p, 0, &b), OG_ERR_INVALID_ARGUMENT);
    og_sampler_destroy(a);
    return og_test_finish();
}
