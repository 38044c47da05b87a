/* The fusion matcher (src/exec/fuse.h).
 * - Small programs written here by hand, each step list expected written
 *   by hand from the program: the patterns found, how overlaps resolve
 *   (gate + up before a run of products, the logits and the last attention
 *   never joined, a pair of q/k norm + rope merged only when the second's
 *   input exists first, a prologue only where the product step holds every
 *   reader of the normed value), and patterns a back end does not run (or
 *   vetoes) left unfused.
 * - Every checkpoint of tests/data/hf, exported in several weight dtypes:
 *   the plan under og_fuse_rules_cuda equals the launch steps of the CUDA
 *   back end's own planner before the matcher existed, and the plan under
 *   og_fuse_rules_cpu the fused runs of the CPU back end's old planner
 *   (both kept below, as they were in src/exec/backend_*.c, as the
 *   independent reference; the CUDA one with its rope table's head_dim read
 *   from the rope's attrs, which og_rope_table_init copies). */
#include "harness.h"
#include "kquant_fixture.h"
#include "exec/fuse.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "import/export.h"
#include "program/ops.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ hand-built programs */

#define MAXI 32

typedef struct hprog {
    og_program_instr in[MAXI];
    const og_program_instr *ptr[MAXI];
    int32_t n;
} hprog;

static og_program_operand A(int32_t i) { return (og_program_operand){OG_VALUE_ACTIVATION, i}; }
static og_program_operand W(int32_t i) { return (og_program_operand){OG_VALUE_TENSOR, i}; }
static const og_program_operand POS = {OG_VALUE_INPUT, OG_INPUT_POSITIONS};
static const og_program_operand TOK = {OG_VALUE_INPUT, OG_INPUT_TOKENS};

/* Appends an instruction of op with output width w and n_in operands. */
static int32_t add(hprog *p, og_op op, int64_t w, int n_in, ...) {
    og_program_instr *in = &p->in[p->n];
    memset(in, 0, sizeof *in);
    in->op = op;
    in->out_width = w;
    in->n_in = n_in;
    in->kv_index = -1;
    va_list ap;
    va_start(ap, n_in);
    for (int k = 0; k < n_in; k++) in->in[k] = va_arg(ap, og_program_operand);
    va_end(ap);
    p->ptr[p->n] = in;
    return p->n++;
}

static int32_t head_norm(hprog *p, int32_t x, int64_t heads, int64_t w) {
    const int32_t i = add(p, OG_OP_HEAD_RMS_NORM, w, 2, A(x), W(90));
    p->in[i].attrs.heads = heads;
    return i;
}

static int32_t rope(hprog *p, int32_t x, int64_t heads, int64_t head_dim) {
    const int32_t i = add(p, OG_OP_ROPE, heads * head_dim, 2, A(x), POS);
    p->in[i].attrs.heads = heads;
    p->in[i].attrs.head_dim = head_dim;
    return i;
}

static og_fuse_program view(const hprog *p, int32_t logits, int32_t last_attend) {
    return (og_fuse_program){p->n, p->ptr, logits, last_attend, NULL};
}

/* An expected step: kind, n_pre, then its instructions, -1 ending them. */
typedef struct want {
    og_fuse_kind kind;
    int32_t n_pre;
    int32_t instr[OG_FUSE_MAX_INSTRS + 1];
} want;

static void check_plan(const char *what, const og_fuse_program *p, const og_fuse_rules *r, const want *w, int n_want) {
    og_fuse_step *s = NULL;
    int32_t n = 0;
    CHECK_OK(og_fuse_plan(p, r, &s, &n));
    CHECK_MSG(n == n_want, "%s: %d steps, want %d", what, n, n_want);
    for (int k = 0; k < n && k < n_want; k++) {
        int32_t wn = 0;
        while (w[k].instr[wn] >= 0) wn++;
        bool same = s[k].kind == w[k].kind && s[k].n_pre == w[k].n_pre && s[k].n == wn;
        for (int32_t j = 0; same && j < wn; j++) same = s[k].instr[j] == w[k].instr[j];
        char got[128] = "", *g = got;
        for (int32_t j = 0; j < s[k].n; j++) g += snprintf(g, (size_t)(got + sizeof got - g), " %d", s[k].instr[j]);
        CHECK_MSG(same, "%s: step %d is kind %d n_pre %d {%s }, want kind %d n_pre %d starting at %d", what, k,
                  (int)s[k].kind, s[k].n_pre, got, (int)w[k].kind, w[k].n_pre, w[k].instr[0]);
    }
    og_free(s);
}

#define ONE(i) {OG_FUSE_ONE, 0, {i, -1}}

static const og_fuse_rules every = {
    .patterns = OG_FUSE_BIT(OG_FUSE_ADD_NORM) | OG_FUSE_BIT(OG_FUSE_NORM_ROPE) | OG_FUSE_BIT(OG_FUSE_GATE_UP) |
                OG_FUSE_BIT(OG_FUSE_PRODUCTS) | OG_FUSE_BIT(OG_FUSE_PROLOGUE),
    .max_products = OG_FUSE_MAX_PRODUCTS,
    .can_fuse = NULL,
};

/* A decoder layer with q/k norms and its head:
 *  0 embed            1 rms_norm(0)       2 q = mm(1)   3 k = mm(1)   4 v = mm(1)
 *  5 qn = hnorm(2)    6 kn = hnorm(3)     7 rope(5)     8 rope(6)     9 attend(7, 8, 4)
 * 10 o = mm(9)       11 add(0, 10)       12 rms_norm(11)
 * 13 gate = mm(12)   14 up = mm(12)      15 swiglu(13, 14)            16 down = mm(15)
 * 17 add(11, 16)     18 rms_norm(17)     19 logits = mm(18) */
static void layer(hprog *p) {
    memset(p, 0, sizeof *p);
    add(p, OG_OP_EMBED, 16, 2, TOK, W(0));
    add(p, OG_OP_RMS_NORM, 16, 2, A(0), W(1));
    add(p, OG_OP_MATMUL, 16, 2, A(1), W(2));
    add(p, OG_OP_MATMUL, 8, 2, A(1), W(3));
    add(p, OG_OP_MATMUL, 8, 2, A(1), W(4));
    head_norm(p, 2, 4, 16);
    head_norm(p, 3, 2, 8);
    rope(p, 5, 4, 4);
    rope(p, 6, 2, 4);
    add(p, OG_OP_UPDATE_AND_ATTEND, 16, 4, A(7), A(8), A(4), POS);
    add(p, OG_OP_MATMUL, 16, 2, A(9), W(5));
    add(p, OG_OP_ADD, 16, 2, A(0), A(10));
    add(p, OG_OP_RMS_NORM, 16, 2, A(11), W(6));
    add(p, OG_OP_MATMUL, 24, 2, A(12), W(7));
    add(p, OG_OP_MATMUL, 24, 2, A(12), W(8));
    add(p, OG_OP_SWIGLU, 24, 2, A(13), A(14));
    add(p, OG_OP_MATMUL, 16, 2, A(15), W(9));
    add(p, OG_OP_ADD, 16, 2, A(11), A(16));
    add(p, OG_OP_RMS_NORM, 16, 2, A(17), W(10));
    add(p, OG_OP_MATMUL, 32, 2, A(18), W(11));
}

static bool pairs_of_one(const og_fuse_program *p, const og_fuse_step *s) {
    (void)p;
    return !(s->kind == OG_FUSE_NORM_ROPE && s->n > 2);
}

static void test_layer(void) {
    og_test_section("a decoder layer: every pattern");
    hprog p;
    layer(&p);
    og_fuse_program v = view(&p, 19, 9);
    const want all[] = {
        ONE(0), ONE(1), {OG_FUSE_PRODUCTS, 0, {2, 3, 4, -1}}, {OG_FUSE_NORM_ROPE, 0, {5, 7, 6, 8, -1}}, ONE(9),
        ONE(10), {OG_FUSE_GATE_UP, 2, {11, 12, 13, 14, 15, -1}}, ONE(16), {OG_FUSE_ONE, 2, {17, 18, 19, -1}},
    };
    check_plan("every pattern", &v, &every, all, 9);

    og_test_section("a decoder layer: the CPU's patterns");
    const want cpu[] = {
        ONE(0), ONE(1), {OG_FUSE_PRODUCTS, 0, {2, 3, 4, -1}}, ONE(5), ONE(6), ONE(7), ONE(8), ONE(9), ONE(10),
        ONE(11), ONE(12), {OG_FUSE_GATE_UP, 0, {13, 14, 15, -1}}, ONE(16), ONE(17), ONE(18), ONE(19),
    };
    check_plan("cpu rules", &v, &og_fuse_rules_cpu, cpu, 16);

    og_test_section("a decoder layer: no prologue, no pair of pairs");
    og_fuse_rules r = every;
    r.patterns &= ~OG_FUSE_BIT(OG_FUSE_PROLOGUE);
    r.can_fuse = pairs_of_one;
    const want no_pro[] = {
        ONE(0), ONE(1), {OG_FUSE_PRODUCTS, 0, {2, 3, 4, -1}}, {OG_FUSE_NORM_ROPE, 0, {5, 7, -1}},
        {OG_FUSE_NORM_ROPE, 0, {6, 8, -1}}, ONE(9), ONE(10), {OG_FUSE_ADD_NORM, 0, {11, 12, -1}},
        {OG_FUSE_GATE_UP, 0, {13, 14, 15, -1}}, ONE(16), {OG_FUSE_ADD_NORM, 0, {17, 18, -1}}, ONE(19),
    };
    check_plan("no prologue, pairs alone", &v, &r, no_pro, 12);

    og_test_section("a decoder layer: products of two at most");
    r = every;
    r.max_products = 2;
    r.patterns &= ~OG_FUSE_BIT(OG_FUSE_NORM_ROPE);
    const want two[] = {
        ONE(0), ONE(1), {OG_FUSE_PRODUCTS, 0, {2, 3, -1}}, ONE(4), ONE(5), ONE(6), ONE(7), ONE(8), ONE(9),
        ONE(10), {OG_FUSE_GATE_UP, 2, {11, 12, 13, 14, 15, -1}}, ONE(16), {OG_FUSE_ONE, 2, {17, 18, 19, -1}},
    };
    check_plan("max_products 2", &v, &r, two, 13);

    og_test_section("the last attention splits nothing it does not cross");
    /* the same program with the attention last at 12 (as if the norm were
     * stateful): 11 and 12 are on the stateful side, 13.. in the tail, so
     * the add + norm stays a step but takes no prologue from the tail */
    v.last_attend = 12;
    const want split[] = {
        ONE(0), ONE(1), {OG_FUSE_PRODUCTS, 0, {2, 3, 4, -1}}, {OG_FUSE_NORM_ROPE, 0, {5, 7, 6, 8, -1}}, ONE(9),
        ONE(10), {OG_FUSE_ADD_NORM, 0, {11, 12, -1}}, {OG_FUSE_GATE_UP, 0, {13, 14, 15, -1}}, ONE(16),
        {OG_FUSE_ONE, 2, {17, 18, 19, -1}},
    };
    check_plan("last attention at 12", &v, &every, split, 10);
    /* with it at 13, the gate product is before it and the up after: no gate + up */
    v.last_attend = 13;
    /* (and the add + norm takes no prologue: the up product, also reading the norm, is not in the step) */
    const want split2[] = {
        ONE(0), ONE(1), {OG_FUSE_PRODUCTS, 0, {2, 3, 4, -1}}, {OG_FUSE_NORM_ROPE, 0, {5, 7, 6, 8, -1}}, ONE(9),
        ONE(10), {OG_FUSE_ADD_NORM, 0, {11, 12, -1}}, ONE(13), ONE(14), ONE(15), ONE(16),
        {OG_FUSE_ONE, 2, {17, 18, 19, -1}},
    };
    check_plan("last attention at 13", &v, &every, split2, 12);
}

static void test_overlaps(void) {
    og_test_section("gate + up before a run of products; the logits never join");
    /* 0 embed  1 a = mm(0)  2 gate = mm(0)  3 up = mm(0)  4 swiglu(2, 3)
     * 5 b = mm(4)  6 logits = mm(4) */
    hprog p = {0};
    add(&p, OG_OP_EMBED, 16, 2, TOK, W(0));
    add(&p, OG_OP_MATMUL, 16, 2, A(0), W(1));
    add(&p, OG_OP_MATMUL, 24, 2, A(0), W(2));
    add(&p, OG_OP_MATMUL, 24, 2, A(0), W(3));
    add(&p, OG_OP_SWIGLU, 24, 2, A(2), A(3));
    add(&p, OG_OP_MATMUL, 16, 2, A(4), W(4));
    add(&p, OG_OP_MATMUL, 32, 2, A(4), W(5));
    og_fuse_program v = view(&p, 6, -1);
    const want w[] = {ONE(0), ONE(1), {OG_FUSE_GATE_UP, 0, {2, 3, 4, -1}}, ONE(5), ONE(6)};
    check_plan("every pattern", &v, &every, w, 5);
    check_plan("cpu rules", &v, &og_fuse_rules_cpu, w, 5);
    /* without gate + up, the three products of x are one run */
    og_fuse_rules r = every;
    r.patterns &= ~OG_FUSE_BIT(OG_FUSE_GATE_UP);
    const want w2[] = {ONE(0), {OG_FUSE_PRODUCTS, 0, {1, 2, 3, -1}}, ONE(4), ONE(5), ONE(6)};
    check_plan("no gate + up", &v, &r, w2, 5);

    og_test_section("gate + up apart: a step at the gate's place, but not for the CPU");
    /* 0 embed  1 gate = mm(0)  2 c = mm(0) read later  3 up = mm(0)  4 add(2, 2)  5 swiglu(1, 3) */
    hprog q = {0};
    add(&q, OG_OP_EMBED, 16, 2, TOK, W(0));
    add(&q, OG_OP_MATMUL, 24, 2, A(0), W(1));
    add(&q, OG_OP_MATMUL, 24, 2, A(0), W(2));
    add(&q, OG_OP_MATMUL, 24, 2, A(0), W(3));
    add(&q, OG_OP_ADD, 24, 2, A(2), A(2));
    add(&q, OG_OP_SWIGLU, 24, 2, A(1), A(3));
    v = view(&q, -1, -1);
    const want apart[] = {ONE(0), {OG_FUSE_GATE_UP, 0, {1, 3, 5, -1}}, ONE(2), ONE(4)};
    check_plan("every pattern", &v, &every, apart, 4);
    const want apart_cpu[] = {ONE(0), {OG_FUSE_PRODUCTS, 0, {1, 2, 3, -1}}, ONE(4), ONE(5)};
    check_plan("cpu rules", &v, &og_fuse_rules_cpu, apart_cpu, 4);

    og_test_section("gate or up read elsewhere: no gate + up");
    /* 0 embed  1 gate = mm(0)  2 up = mm(0)  3 swiglu(1, 2)  4 add(2, 3) */
    hprog g = {0};
    add(&g, OG_OP_EMBED, 24, 2, TOK, W(0));
    add(&g, OG_OP_MATMUL, 24, 2, A(0), W(1));
    add(&g, OG_OP_MATMUL, 24, 2, A(0), W(2));
    add(&g, OG_OP_SWIGLU, 24, 2, A(1), A(2));
    add(&g, OG_OP_ADD, 24, 2, A(2), A(3));
    v = view(&g, -1, -1);
    const want g2[] = {ONE(0), {OG_FUSE_PRODUCTS, 0, {1, 2, -1}}, ONE(3), ONE(4)};
    check_plan("up read twice", &v, &every, g2, 4);
}

/* Products of one width only (a stand-in for CUDA's weights of one dtype). */
static bool one_width(const og_fuse_program *p, const og_fuse_step *s) {
    for (int32_t k = s->n_pre + 1; k < s->n; k++)
        if (s->kind == OG_FUSE_PRODUCTS && p->instr[s->instr[k]]->out_width != p->instr[s->instr[s->n_pre]]->out_width)
            return false;
    return true;
}

static void test_products(void) {
    og_test_section("a run of products ends at the first refusal and at max_products");
    /* 0 embed, 1..6 = mm(0) of widths 16 16 8 16 16 16 */
    hprog p = {0};
    add(&p, OG_OP_EMBED, 16, 2, TOK, W(0));
    const int64_t widths[6] = {16, 16, 8, 16, 16, 16};
    for (int k = 0; k < 6; k++) add(&p, OG_OP_MATMUL, widths[k], 2, A(0), W(1 + k));
    og_fuse_program v = view(&p, -1, -1);
    og_fuse_rules r = every;
    r.can_fuse = one_width;
    r.max_products = 2;
    const want w[] = {ONE(0), {OG_FUSE_PRODUCTS, 0, {1, 2, -1}}, ONE(3), {OG_FUSE_PRODUCTS, 0, {4, 5, -1}}, ONE(6)};
    check_plan("one width, two at most", &v, &r, w, 5);
    r.max_products = 8;
    const want w8[] = {ONE(0), {OG_FUSE_PRODUCTS, 0, {1, 2, -1}}, ONE(3), {OG_FUSE_PRODUCTS, 0, {4, 5, 6, -1}}};
    check_plan("one width", &v, &r, w8, 4);
    const want all[] = {ONE(0), {OG_FUSE_PRODUCTS, 0, {1, 2, 3, 4, -1}}, {OG_FUSE_PRODUCTS, 0, {5, 6, -1}}};
    /* without the tensors, CUDA cannot tell the weights alike and fuses nothing */
    const want none[] = {ONE(0), ONE(1), ONE(2), ONE(3), ONE(4), ONE(5), ONE(6)};
    check_plan("cuda rules, no tensors", &v, &og_fuse_rules_cuda, none, 7);
    const want cpu[] = {ONE(0), {OG_FUSE_PRODUCTS, 0, {1, 2, 3, 4, 5, 6, -1}}};
    check_plan("cpu rules", &v, &og_fuse_rules_cpu, cpu, 2);
    r = every;
    r.max_products = 4;
    check_plan("four at most", &v, &r, all, 3);
}

static void test_norms(void) {
    og_test_section("q/k norm + rope: the pair of pairs and its limits");
    /* 0 embed  1 q = mm(0)  2 qn = hnorm(1)  3 rope(2)  4 k = mm(0)  5 kn = hnorm(4)  6 rope(5)
     * the second pair's input (4) is made after the first pair starts (2): no merge */
    hprog p = {0};
    add(&p, OG_OP_EMBED, 16, 2, TOK, W(0));
    add(&p, OG_OP_MATMUL, 16, 2, A(0), W(1));
    head_norm(&p, 1, 4, 16);
    rope(&p, 2, 4, 4);
    add(&p, OG_OP_MATMUL, 8, 2, A(0), W(2));
    head_norm(&p, 4, 2, 8);
    rope(&p, 5, 2, 4);
    og_fuse_program v = view(&p, -1, -1);
    const want w[] = {ONE(0), ONE(1), {OG_FUSE_NORM_ROPE, 0, {2, 3, -1}}, ONE(4), {OG_FUSE_NORM_ROPE, 0, {5, 6, -1}}};
    check_plan("late k", &v, &every, w, 5);

    og_test_section("a head norm read twice, or a rope of other heads: no fusion");
    /* 0 embed  1 q = mm(0)  2 qn = hnorm(1)  3 rope(2)  4 add(2, 3)
     * 5 kn = hnorm(1) over 2 heads  6 rope(5) over 4 heads */
    hprog q = {0};
    add(&q, OG_OP_EMBED, 16, 2, TOK, W(0));
    add(&q, OG_OP_MATMUL, 16, 2, A(0), W(1));
    head_norm(&q, 1, 4, 16);
    rope(&q, 2, 4, 4);
    add(&q, OG_OP_ADD, 16, 2, A(2), A(3));
    head_norm(&q, 1, 2, 16);
    rope(&q, 5, 4, 4);
    v = view(&q, -1, -1);
    const want w2[] = {ONE(0), ONE(1), ONE(2), ONE(3), ONE(4), ONE(5), ONE(6)};
    check_plan("no pair", &v, &every, w2, 7);

    og_test_section("a prologue needs every reader of the norm in the product step");
    /* 0 embed  1 h = mm(0)  2 add(0, 1)  3 rms_norm(2)  4 a = mm(3)  5 b = mm(3)  6 add(3, 5) */
    hprog r = {0};
    add(&r, OG_OP_EMBED, 16, 2, TOK, W(0));
    add(&r, OG_OP_MATMUL, 16, 2, A(0), W(1));
    add(&r, OG_OP_ADD, 16, 2, A(0), A(1));
    add(&r, OG_OP_RMS_NORM, 16, 2, A(2), W(2));
    add(&r, OG_OP_MATMUL, 16, 2, A(3), W(3));
    add(&r, OG_OP_MATMUL, 16, 2, A(3), W(4));
    add(&r, OG_OP_ADD, 16, 2, A(3), A(5));
    v = view(&r, -1, -1);
    const want w3[] = {ONE(0), ONE(1), {OG_FUSE_ADD_NORM, 0, {2, 3, -1}}, {OG_FUSE_PRODUCTS, 0, {4, 5, -1}}, ONE(6)};
    check_plan("norm read by an add", &v, &every, w3, 5);
    r.in[6].in[0] = A(4); /* now only the products read the norm */
    const want w4[] = {ONE(0), ONE(1), {OG_FUSE_PRODUCTS, 2, {2, 3, 4, 5, -1}}, ONE(6)};
    check_plan("norm read by the products", &v, &every, w4, 4);
    /* an add whose sum the norm does not read, or a norm not right after its add */
    r.in[3].in[0] = A(1);
    const want w5[] = {ONE(0), ONE(1), ONE(2), ONE(3), {OG_FUSE_PRODUCTS, 0, {4, 5, -1}}, ONE(6)};
    check_plan("norm of another value", &v, &every, w5, 6);
}

/* ------------------------------------------------------------ the old planners (reference) */

enum { R_ONE = 0, R_ADD_NORM, R_NORM_ROPE, R_GATE_UP, R_GEMVS };
#define R_MAX_INSTRS (OG_GEMV_CUDA_MAX_PARTS + 2)
#define R_NORM_PROLOGUE_MAX_ROWS 16384

typedef struct ref_step {
    int kind;
    int32_t n, n_pre;
    int32_t instr[R_MAX_INSTRS];
} ref_step;

typedef struct ref_ctx {
    const og_program *prog;
    int32_t n, logits_instr, last_attend;
    int32_t *uses, *anchor;
    ref_step *group;
} ref_ctx;

static int32_t producer(og_program_operand o) { return o.kind == OG_VALUE_ACTIVATION ? o.index : -1; }
static bool same_operand(og_program_operand a, og_program_operand b) { return a.kind == b.kind && a.index == b.index; }
static const og_program_instr *at(const ref_ctx *c, int32_t i) { return og_program_instr_at(c->prog, i); }

static bool joinable(const ref_ctx *c, int32_t i, int32_t first) {
    return c->anchor[i] < 0 && i != c->logits_instr && (i > c->last_attend) == (first > c->last_attend);
}

static void add_group(ref_ctx *c, int kind, int32_t n, const int32_t *members) {
    int32_t a = members[0];
    for (int32_t k = 1; k < n; k++)
        if (members[k] < a) a = members[k];
    ref_step *g = &c->group[a];
    g->kind = kind;
    g->n = n;
    for (int32_t k = 0; k < n; k++) {
        g->instr[k] = members[k];
        c->anchor[members[k]] = a;
    }
}

static bool weights_alike(const ref_ctx *c, const og_program_instr *a, const og_program_instr *b) {
    const og_program_tensor *wa = og_program_tensor_at(c->prog, a->in[1].index);
    const og_program_tensor *wb = og_program_tensor_at(c->prog, b->in[1].index);
    return a->in[1].kind == OG_VALUE_TENSOR && b->in[1].kind == OG_VALUE_TENSOR && wa->dtype == wb->dtype &&
           a->n_in == b->n_in;
}

static void ref_find_groups(ref_ctx *c) {
    const int32_t n = c->n;
    for (int32_t i = 0; i + 1 < n; i++) {
        const og_program_instr *a = at(c, i), *b = at(c, i + 1);
        if (a->op == OG_OP_ADD && b->op == OG_OP_RMS_NORM && producer(b->in[0]) == i && joinable(c, i, i) &&
            joinable(c, i + 1, i))
            add_group(c, R_ADD_NORM, 2, (int32_t[]){i, i + 1});
    }
    for (int32_t i = 0; i < n; i++) {
        const og_program_instr *a = at(c, i);
        if (a->op != OG_OP_HEAD_RMS_NORM || c->uses[i] != 1 || !joinable(c, i, i)) continue;
        int32_t j = i + 1;
        while (j < n && producer(at(c, j)->in[0]) != i) j++;
        if (j == n) continue;
        const og_program_instr *r = at(c, j);
        if (r->op == OG_OP_ROPE && r->attrs.heads == a->attrs.heads && joinable(c, j, i) &&
            r->attrs.head_dim * a->attrs.heads == a->out_width)
            add_group(c, R_NORM_ROPE, 2, (int32_t[]){i, j});
    }
    for (int32_t a = 0; a < n; a++) {
        if (c->anchor[a] != a || c->group[a].kind != R_NORM_ROPE || c->group[a].n != 2) continue;
        for (int32_t b = a + 1; b < n; b++) {
            if (c->anchor[b] != b || c->group[b].kind != R_NORM_ROPE || c->group[b].n != 2 ||
                (a > c->last_attend) != (b > c->last_attend))
                continue;
            const int32_t p = producer(at(c, b)->in[0]);
            if (p >= a) break;
            const ref_step first = c->group[a], second = c->group[b];
            add_group(c, R_NORM_ROPE, 4, (int32_t[]){first.instr[0], first.instr[1], second.instr[0], second.instr[1]});
            break;
        }
    }
    for (int32_t s = 0; s < n; s++) {
        const og_program_instr *sw = at(c, s);
        if (sw->op != OG_OP_SWIGLU) continue;
        const int32_t g = producer(sw->in[0]), u = producer(sw->in[1]);
        if (g < 0 || u < 0 || g == u || c->uses[g] != 1 || c->uses[u] != 1) continue;
        const og_program_instr *gi = at(c, g), *ui = at(c, u);
        const int32_t first = g < u ? g : u;
        if (gi->op == OG_OP_MATMUL && ui->op == OG_OP_MATMUL && same_operand(gi->in[0], ui->in[0]) &&
            weights_alike(c, gi, ui) && gi->out_width == ui->out_width && joinable(c, g, first) &&
            joinable(c, u, first) && joinable(c, s, first))
            add_group(c, R_GATE_UP, 3, (int32_t[]){g, u, s});
    }
    for (int32_t i = 0; i < n; i++) {
        const og_program_instr *a = at(c, i);
        if (a->op != OG_OP_MATMUL || !joinable(c, i, i)) continue;
        int32_t members[R_MAX_INSTRS] = {i}, k = 1;
        for (int32_t j = i + 1; j < n && k < R_MAX_INSTRS; j++) {
            const og_program_instr *b = at(c, j);
            if (b->op != OG_OP_MATMUL || !joinable(c, j, i) || !same_operand(a->in[0], b->in[0]) ||
                !weights_alike(c, a, b))
                break;
            members[k++] = j;
        }
        if (k > 1) add_group(c, R_GEMVS, k, members);
    }
}

static bool ref_takes_prologue(const ref_ctx *c, const ref_step *p, int32_t norm) {
    if (p->n_pre || !(p->kind == R_GEMVS || p->kind == R_GATE_UP || (p->kind == R_ONE && at(c, p->instr[0])->op == OG_OP_MATMUL)))
        return false;
    if ((p->instr[0] > c->last_attend) != (norm > c->last_attend)) return false;
    int32_t reads = 0;
    for (int32_t j = 0; j < p->n; j++) {
        const og_program_instr *in = at(c, p->instr[j]);
        for (int32_t o = 0; o < in->n_in; o++)
            if (producer(in->in[o]) == norm) {
                if (in->op != OG_OP_MATMUL || o != 0) return false;
                reads++;
            }
    }
    int64_t rows = 0;
    for (int32_t j = 0; j < p->n; j++)
        if (at(c, p->instr[j])->op == OG_OP_MATMUL) rows += at(c, p->instr[j])->out_width;
    return reads > 0 && reads == c->uses[norm] && rows <= R_NORM_PROLOGUE_MAX_ROWS;
}

/* The old CUDA plan_steps: its launch steps into steps[] (n_instrs room). */
static int32_t ref_cuda_steps(const og_program *prog, int32_t logits, int32_t last_attend, ref_step *steps) {
    ref_ctx c = {prog, og_program_n_instrs(prog), logits, last_attend, NULL, NULL, NULL};
    c.uses = calloc((size_t)c.n, sizeof *c.uses);
    c.anchor = malloc((size_t)c.n * sizeof *c.anchor);
    c.group = calloc((size_t)c.n, sizeof *c.group);
    for (int32_t i = 0; i < c.n; i++) {
        c.anchor[i] = -1;
        const og_program_instr *in = at(&c, i);
        for (int32_t j = 0; j < in->n_in; j++)
            if (producer(in->in[j]) >= 0) c.uses[producer(in->in[j])]++;
    }
    ref_find_groups(&c);
    int32_t n_steps = 0;
    for (int32_t i = 0; i < c.n; i++) {
        if (c.anchor[i] == i) steps[n_steps++] = c.group[i];
        else if (c.anchor[i] < 0) steps[n_steps++] = (ref_step){R_ONE, 1, 0, {i}};
    }
    int32_t kept = 0;
    for (int32_t k = 0; k < n_steps; k++) {
        ref_step *sp = &steps[k];
        if (sp->kind == R_ADD_NORM && k + 1 < n_steps && ref_takes_prologue(&c, &steps[k + 1], sp->instr[1])) {
            ref_step *next = &steps[k + 1];
            memmove(next->instr + 2, next->instr, (size_t)next->n * sizeof *next->instr);
            next->instr[0] = sp->instr[0];
            next->instr[1] = sp->instr[1];
            next->n += 2;
            next->n_pre = 2;
            continue;
        }
        steps[kept++] = *sp;
    }
    free(c.uses);
    free(c.anchor);
    free(c.group);
    return kept;
}

/* The old CPU plan_fusion: fuse_end[i] (-1: no run starts at i), glu[i]. */
static void ref_cpu_runs(const og_program *prog, int32_t logits, int32_t last_attend, int32_t *fuse_end, bool *glu) {
    const int32_t n = og_program_n_instrs(prog);
#define IN_TAIL(i) ((i) > last_attend)
    for (int32_t i = 0; i < n; i++) fuse_end[i] = -1, glu[i] = false;
    for (int32_t i = 0; i < n;) {
        const og_program_instr *a = og_program_instr_at(prog, i);
        int32_t e = i;
        if (a->op == OG_OP_MATMUL && a->in[0].kind == OG_VALUE_ACTIVATION && i != logits) {
            while (e + 1 < n && e + 1 - i < OG_MATMUL_MAX_PARTS && e + 1 != logits && IN_TAIL(e + 1) == IN_TAIL(i)) {
                const og_program_instr *b = og_program_instr_at(prog, e + 1);
                if (b->op != OG_OP_MATMUL || b->in[0].kind != OG_VALUE_ACTIVATION || b->in[0].index != a->in[0].index)
                    break;
                e++;
            }
        }
        if (e == i) {
            i++;
            continue;
        }
        fuse_end[i] = e;
        if (e == i + 1 && e + 1 < n && IN_TAIL(e + 1) == IN_TAIL(i)) {
            const og_program_instr *g = og_program_instr_at(prog, e + 1);
            if (g->op == OG_OP_SWIGLU && g->in[0].kind == OG_VALUE_ACTIVATION && g->in[0].index == i &&
                g->in[1].kind == OG_VALUE_ACTIVATION && g->in[1].index == i + 1 &&
                a->out_width == og_program_instr_at(prog, e)->out_width && g->out_width == a->out_width) {
                glu[i] = true;
                fuse_end[i] = e + 1;
            }
        }
        i = fuse_end[i] + 1;
    }
#undef IN_TAIL
}

/* ------------------------------------------------------------ exported checkpoints */

typedef struct tally {
    int programs, fused_cuda, fused_cpu, prologues, norm_ropes, kquant_programs;
} tally;

static void compare_program(const char *what, const char *path, tally *t) {
    og_program *prog = NULL;
    CHECK_OK(og_program_open(path, &prog));
    if (!prog) return;
    const int32_t n = og_program_n_instrs(prog), logits = og_program_logits_instr(prog);
    int32_t last_attend = -1;
    for (int32_t i = 0; i < n; i++)
        if (og_op_is_stateful(og_program_instr_at(prog, i)->op)) last_attend = i;
    og_fuse_program fp;
    CHECK_OK(og_fuse_program_of(prog, logits, last_attend, &fp));

    /* CUDA: the launch steps */
    ref_step *ref = calloc((size_t)n, sizeof *ref);
    const int32_t n_ref = ref_cuda_steps(prog, logits, last_attend, ref);
    og_fuse_step *s = NULL;
    int32_t n_s = 0;
    CHECK_OK(og_fuse_plan(&fp, &og_fuse_rules_cuda, &s, &n_s));
    CHECK_MSG(n_s == n_ref, "%s: cuda: %d steps, the old planner %d", what, n_s, n_ref);
    static const og_fuse_kind kinds[] = {OG_FUSE_ONE, OG_FUSE_ADD_NORM, OG_FUSE_NORM_ROPE, OG_FUSE_GATE_UP,
                                         OG_FUSE_PRODUCTS};
    int bad = 0;
    for (int32_t k = 0; k < n_s && k < n_ref; k++) {
        bool same = s[k].kind == kinds[ref[k].kind] && s[k].n == ref[k].n && s[k].n_pre == ref[k].n_pre;
        for (int32_t j = 0; same && j < s[k].n; j++) same = s[k].instr[j] == ref[k].instr[j];
        if (!same && bad++ < 3)
            fprintf(stderr, "%s: cuda step %d: kind %d n %d n_pre %d from %d; old: kind %d n %d n_pre %d from %d\n",
                    what, k, (int)s[k].kind, s[k].n, s[k].n_pre, s[k].instr[0], ref[k].kind, ref[k].n, ref[k].n_pre,
                    ref[k].instr[0]);
        if (s[k].n > 1) t->fused_cuda++;
        if (s[k].n_pre) t->prologues++;
        if (s[k].kind == OG_FUSE_NORM_ROPE) t->norm_ropes++;
    }
    CHECK_MSG(bad == 0, "%s: %d cuda steps differ from the old planner's", what, bad);
    og_free(s);
    free(ref);

    /* CPU: the fused runs */
    int32_t *end = malloc((size_t)n * sizeof *end);
    bool *glu = malloc((size_t)n * sizeof *glu);
    ref_cpu_runs(prog, logits, last_attend, end, glu);
    CHECK_OK(og_fuse_plan(&fp, &og_fuse_rules_cpu, &s, &n_s));
    int32_t *got_end = malloc((size_t)n * sizeof *got_end);
    bool *got_glu = calloc((size_t)n, sizeof *got_glu);
    for (int32_t i = 0; i < n; i++) got_end[i] = -1;
    for (int32_t k = 0; k < n_s; k++) {
        if (s[k].n < 2) continue;
        got_end[s[k].instr[0]] = s[k].instr[s[k].n - 1];
        got_glu[s[k].instr[0]] = s[k].kind == OG_FUSE_GATE_UP;
        t->fused_cpu++;
    }
    bad = 0;
    for (int32_t i = 0; i < n; i++)
        if ((got_end[i] != end[i] || got_glu[i] != glu[i]) && bad++ < 3)
            fprintf(stderr, "%s: cpu run at %d: ends %d glu %d; old: ends %d glu %d\n", what, i, got_end[i],
                    got_glu[i], end[i], glu[i]);
    CHECK_MSG(bad == 0, "%s: %d cpu runs differ from the old planner's", what, bad);
    og_free(s);
    free(end);
    free(glu);
    free(got_end);
    free(got_glu);
    og_free((void *)fp.instr);
    og_program_close(prog);
    t->programs++;
}

static void test_checkpoints(void) {
    og_test_section("exported checkpoints: the plans of the old planners");
    char dir[] = "/tmp/og_test_fuse_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK_MSG(false, "mkdtemp");
        return;
    }
    static const char *names[] = {"llama-gqa", "mistral-sw", "qwen2-bias", "qwen3-mixed", "qwen3-moe",
                                  "qwen3-moe-fused", "qwen35-dense", "qwen35-moe", "qwen3next"};
    /* OG_DTYPE_BF16 stands for a q2_k mix (matrices of small rows fall back
     * to q4 or q8: products of one input in two dtypes) */
    static const og_dtype weights[] = {OG_DTYPE_COUNT, OG_DTYPE_F32, OG_DTYPE_Q8, OG_DTYPE_Q4, OG_DTYPE_Q4_K,
                                       OG_DTYPE_BF16};
    tally t = {0};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        for (size_t w = 0; w < sizeof weights / sizeof *weights; w++) {
            char src[512], out[600], what[128];
            snprintf(src, sizeof src, "%s/hf/%s", OG_TEST_DATA_DIR, names[i]);
            snprintf(out, sizeof out, "%s/p.ogp", dir);
            snprintf(what, sizeof what, "%s (%s weights)", names[i],
                     weights[w] == OG_DTYPE_COUNT  ? "checkpoint"
                     : weights[w] == OG_DTYPE_BF16 ? "q2_k mix"
                                                   : og_dtype_name(weights[w]));
            og_export_options o;
            og_export_default_options(&o);
            if (weights[w] == OG_DTYPE_F32) o.dtype = OG_DTYPE_F32;
            else if (weights[w] == OG_DTYPE_BF16) o.mix = OG_MIX_Q2_K;
            else if (weights[w] != OG_DTYPE_COUNT) o.weights = weights[w];
            og_status st = og_export_hf(src, out, &o, NULL);
            CHECK_MSG(st == OG_OK, "%s: export: %s", what, og_last_error());
            if (st == OG_OK) compare_program(what, out, &t);
            unlink(out);
        }
    }
    /* a checkpoint whose matrices are whole k-quant blocks (hidden 256): k-quant
     * products (never fused on CUDA) and mixes of dtypes in one layer */
    char kq[600];
    snprintf(kq, sizeof kq, "%s/kq", dir);
    CHECK(mkdir(kq, 0700) == 0 && og_test_write_kq_checkpoint(kq));
    static const struct {
        og_dtype weights;
        og_weight_mix mix;
        const char *name;
    } kq_cases[] = {{OG_DTYPE_COUNT, OG_MIX_NONE, "kq checkpoint"}, {OG_DTYPE_Q4_K, OG_MIX_NONE, "kq q4_k"},
                    {OG_DTYPE_Q8, OG_MIX_NONE, "kq q8"}, {OG_DTYPE_COUNT, OG_MIX_Q4_K_M, "kq mix q4_k_m"},
                    {OG_DTYPE_COUNT, OG_MIX_Q2_K, "kq mix q2_k"}, {OG_DTYPE_COUNT, OG_MIX_Q3_K_S, "kq mix q3_k_s"}};
    for (size_t k = 0; k < sizeof kq_cases / sizeof *kq_cases; k++) {
        char out[700];
        snprintf(out, sizeof out, "%s/p.ogp", dir);
        og_export_options o;
        og_export_default_options(&o);
        if (kq_cases[k].weights != OG_DTYPE_COUNT) o.weights = kq_cases[k].weights;
        o.mix = kq_cases[k].mix;
        og_export_summary sum;
        og_status st = og_export_hf(kq, out, &o, &sum);
        CHECK_MSG(st == OG_OK, "%s: export: %s", kq_cases[k].name, og_last_error());
        if (st == OG_OK) compare_program(kq_cases[k].name, out, &t);
        unlink(out);
        if (st == OG_OK && kq_cases[k].weights == OG_DTYPE_Q4_K) t.kquant_programs++;
    }
    char f[700];
    snprintf(f, sizeof f, "%s/config.json", kq);
    unlink(f);
    snprintf(f, sizeof f, "%s/model.safetensors", kq);
    unlink(f);
    rmdir(kq);
    rmdir(dir);
    printf("%d programs: %d fused CUDA steps (%d with a prologue, %d norm + rope), %d fused CPU runs\n", t.programs,
           t.fused_cuda, t.prologues, t.norm_ropes, t.fused_cpu);
    /* the comparison saw every pattern */
    CHECK(t.programs == (int)(sizeof names / sizeof *names * sizeof weights / sizeof *weights +
                              sizeof kq_cases / sizeof *kq_cases));
    CHECK(t.kquant_programs == 1);
    CHECK(t.fused_cuda > 0 && t.prologues > 0 && t.norm_ropes > 0 && t.fused_cpu > 0);
}

int main(void) {
    test_layer();
    test_overlaps();
    test_products();
    test_norms();
    test_checkpoints();
    return og_test_finish();
}
