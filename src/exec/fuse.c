/* The fusion matcher (fuse.h): the patterns, how overlaps resolve, and what
 * each back end runs. */
#include "exec/fuse.h"

#include "kernels/cuda/ops_cuda.h" /* OG_GEMV_CUDA_MAX_PARTS: plain C, no CUDA runtime */
#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

typedef struct match {
    const og_fuse_program *p;
    const og_fuse_rules *r;
    int32_t *uses;        /* [n]: operand references of each output */
    int32_t *anchor;      /* [n]: first instruction of its step, -1 while in none */
    og_fuse_step *group;  /* [n]: the step anchored at i */
} match;

static const og_program_instr *at(const match *c, int32_t i) { return c->p->instr[i]; }
static bool runs(const match *c, og_fuse_kind k) { return (c->r->patterns & OG_FUSE_BIT(k)) != 0; }
static bool same_operand(og_program_operand a, og_program_operand b) { return a.kind == b.kind && a.index == b.index; }

/* i may join a step whose first instruction is first: in no step yet, not
 * the logits, on the same side of the last attention as first. */
static bool joinable(const match *c, int32_t i, int32_t first) {
    const int32_t last = c->p->last_attend;
    return c->anchor[i] < 0 && i != c->p->logits_instr && (i > last) == (first > last);
}

static og_fuse_step make(og_fuse_kind kind, int32_t n, const int32_t *members) {
    og_fuse_step s = {kind, n, 0, {0}};
    memcpy(s.instr, members, (size_t)n * sizeof *members);
    return s;
}

static bool allowed(const match *c, const og_fuse_step *s) {
    return runs(c, s->kind) && (!c->r->can_fuse || c->r->can_fuse(c->p, s));
}

/* Records step s, anchored at its smallest instruction. */
static void add_step(match *c, const og_fuse_step *s) {
    int32_t a = s->instr[0];
    for (int32_t k = 1; k < s->n; k++)
        if (s->instr[k] < a) a = s->instr[k];
    c->group[a] = *s;
    for (int32_t k = 0; k < s->n; k++) c->anchor[s->instr[k]] = a;
}

static void find_add_norm(match *c) {
    for (int32_t i = 0; i + 1 < c->p->n_instrs; i++) {
        const og_program_instr *a = at(c, i), *b = at(c, i + 1);
        if (a->op != OG_OP_ADD || b->op != OG_OP_RMS_NORM || og_fuse_producer(b->in[0]) != i ||
            !joinable(c, i, i) || !joinable(c, i + 1, i))
            continue;
        const og_fuse_step s = make(OG_FUSE_ADD_NORM, 2, (int32_t[]){i, i + 1});
        if (allowed(c, &s)) add_step(c, &s);
    }
}

static void find_norm_rope(match *c) {
    const int32_t n = c->p->n_instrs;
    for (int32_t i = 0; i < n; i++) { /* head_rms_norm -> rope, its only reader */
        const og_program_instr *a = at(c, i);
        if (a->op != OG_OP_HEAD_RMS_NORM || c->uses[i] != 1 || !joinable(c, i, i)) continue;
        int32_t j = i + 1;
        while (j < n && og_fuse_producer(at(c, j)->in[0]) != i) j++;
        if (j == n) continue;
        const og_program_instr *r = at(c, j);
        if (r->op != OG_OP_ROPE || r->attrs.heads != a->attrs.heads || !joinable(c, j, i) ||
            r->attrs.head_dim * a->attrs.heads != a->out_width)
            continue;
        const og_fuse_step s = make(OG_FUSE_NORM_ROPE, 2, (int32_t[]){i, j});
        if (allowed(c, &s)) add_step(c, &s);
    }
    const int32_t last = c->p->last_attend;
    for (int32_t a = 0; a < n; a++) { /* two pairs (q and k) -> one step */
        if (c->anchor[a] != a || c->group[a].kind != OG_FUSE_NORM_ROPE || c->group[a].n != 2) continue;
        for (int32_t b = a + 1; b < n; b++) {
            if (c->anchor[b] != b || c->group[b].kind != OG_FUSE_NORM_ROPE || c->group[b].n != 2 ||
                (a > last) != (b > last))
                continue;
            /* b's pair runs at a's place: only when what it reads exists by then */
            if (og_fuse_producer(at(c, b)->in[0]) >= a) break;
            const og_fuse_step *f = &c->group[a], *g = &c->group[b];
            const og_fuse_step s =
                make(OG_FUSE_NORM_ROPE, 4, (int32_t[]){f->instr[0], f->instr[1], g->instr[0], g->instr[1]});
            if (allowed(c, &s)) add_step(c, &s);
            break;
        }
    }
}

static void find_gate_up(match *c) {
    for (int32_t s = 0; s < c->p->n_instrs; s++) {
        const og_program_instr *sw = at(c, s);
        if (sw->op != OG_OP_SWIGLU) continue;
        const int32_t g = og_fuse_producer(sw->in[0]), u = og_fuse_producer(sw->in[1]);
        if (g < 0 || u < 0 || g == u || c->uses[g] != 1 || c->uses[u] != 1) continue;
        const og_program_instr *gi = at(c, g), *ui = at(c, u);
        const int32_t first = g < u ? g : u;
        if (gi->op != OG_OP_MATMUL || ui->op != OG_OP_MATMUL || !same_operand(gi->in[0], ui->in[0]) ||
            gi->out_width != ui->out_width || sw->out_width != gi->out_width || !joinable(c, g, first) ||
            !joinable(c, u, first) || !joinable(c, s, first))
            continue;
        const og_fuse_step st = make(OG_FUSE_GATE_UP, 3, (int32_t[]){g, u, s});
        if (allowed(c, &st)) add_step(c, &st);
    }
}

static void find_products(match *c) {
    const int32_t n = c->p->n_instrs;
    int32_t max = c->r->max_products < OG_FUSE_MAX_PRODUCTS ? c->r->max_products : OG_FUSE_MAX_PRODUCTS;
    for (int32_t i = 0; i < n; i++) {
        const og_program_instr *a = at(c, i);
        if (a->op != OG_OP_MATMUL || a->in[0].kind != OG_VALUE_ACTIVATION || !joinable(c, i, i)) continue;
        og_fuse_step s = {OG_FUSE_PRODUCTS, 1, 0, {i}};
        for (int32_t j = i + 1; j < n && s.n < max; j++) {
            const og_program_instr *b = at(c, j);
            if (b->op != OG_OP_MATMUL || !joinable(c, j, i) || !same_operand(a->in[0], b->in[0])) break;
            s.instr[s.n++] = j;
            if (!allowed(c, &s)) {
                s.n--;
                break;
            }
        }
        if (s.n > 1) add_step(c, &s);
    }
}

/* Step p (the step right after an add + rms_norm step whose norm is
 * instruction norm) holds every reader of the normed value, each a product
 * reading it as its x. */
static bool takes_prologue(const match *c, const og_fuse_step *p, int32_t norm) {
    if (p->n_pre || !(p->kind == OG_FUSE_PRODUCTS || p->kind == OG_FUSE_GATE_UP ||
                      (p->kind == OG_FUSE_ONE && at(c, p->instr[0])->op == OG_OP_MATMUL)))
        return false;
    const int32_t last = c->p->last_attend;
    if ((p->instr[0] > last) != (norm > last)) return false; /* rows differ in the tail */
    int32_t reads = 0;
    for (int32_t j = 0; j < p->n; j++) {
        const og_program_instr *in = at(c, p->instr[j]);
        for (int32_t o = 0; o < in->n_in; o++)
            if (og_fuse_producer(in->in[o]) == norm) {
                if (in->op != OG_OP_MATMUL || o != 0) return false;
                reads++;
            }
    }
    return reads > 0 && reads == c->uses[norm];
}

/* Folds each add + rms_norm step into the product step after it where that
 * takes it as its prologue; returns the steps left. */
static int32_t fold_prologues(const match *c, og_fuse_step *steps, int32_t n_steps) {
    int32_t kept = 0;
    for (int32_t k = 0; k < n_steps; k++) {
        const og_fuse_step *sp = &steps[k];
        if (sp->kind == OG_FUSE_ADD_NORM && k + 1 < n_steps && takes_prologue(c, &steps[k + 1], sp->instr[1])) {
            og_fuse_step f = steps[k + 1];
            f.instr[0] = sp->instr[0];
            f.instr[1] = sp->instr[1];
            memcpy(f.instr + 2, steps[k + 1].instr, (size_t)steps[k + 1].n * sizeof *f.instr);
            f.n += 2;
            f.n_pre = 2;
            if (f.n <= OG_FUSE_MAX_INSTRS && (!c->r->can_fuse || c->r->can_fuse(c->p, &f))) {
                steps[k + 1] = f;
                continue; /* the add + norm step itself is dropped */
            }
        }
        steps[kept++] = *sp;
    }
    return kept;
}

og_status og_fuse_plan(const og_fuse_program *p, const og_fuse_rules *r, og_fuse_step **steps, int32_t *n_steps) {
    const int32_t n = p->n_instrs;
    *steps = NULL;
    *n_steps = 0;
    match c = {p, r, og_calloc((size_t)n + 1, sizeof(int32_t)), og_malloc(((size_t)n + 1) * sizeof(int32_t)),
               og_calloc((size_t)n + 1, sizeof(og_fuse_step))};
    og_fuse_step *out = og_calloc((size_t)n + 1, sizeof *out);
    if (!c.uses || !c.anchor || !c.group || !out) {
        og_free(c.uses);
        og_free(c.anchor);
        og_free(c.group);
        og_free(out);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the fusion plan");
    }
    for (int32_t i = 0; i < n; i++) {
        c.anchor[i] = -1;
        const og_program_instr *in = p->instr[i];
        for (int32_t j = 0; j < in->n_in; j++) {
            const int32_t q = og_fuse_producer(in->in[j]);
            if (q >= 0 && q < n) c.uses[q]++;
        }
    }
    find_add_norm(&c);
    find_norm_rope(&c);
    find_gate_up(&c);
    find_products(&c);
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        if (c.anchor[i] == i) out[k++] = c.group[i];
        else if (c.anchor[i] < 0) out[k++] = (og_fuse_step){OG_FUSE_ONE, 1, 0, {i}};
    }
    if (runs(&c, OG_FUSE_PROLOGUE)) k = fold_prologues(&c, out, k);
    og_free(c.uses);
    og_free(c.anchor);
    og_free(c.group);
    *steps = out;
    *n_steps = k;
    return OG_OK;
}

og_status og_fuse_program_of(const og_program *prog, int32_t logits_instr, int32_t last_attend, og_fuse_program *out) {
    const int32_t n = og_program_n_instrs(prog);
    const og_program_instr **instr = og_malloc(((size_t)n + 1) * sizeof *instr);
    if (!instr) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the fusion plan");
    for (int32_t i = 0; i < n; i++) instr[i] = og_program_instr_at(prog, i);
    *out = (og_fuse_program){n, instr, logits_instr, last_attend, prog};
    return OG_OK;
}

/* ------------------------------------------------------------ the CPU */

/* The CPU runs a step's instructions as one contiguous run of the program
 * (backend_cpu.c): products of one x (og_matmul_rows_multi_cpu), and gate,
 * up and swiglu right after one another (og_matmul_rows_swiglu_cpu). */
static bool cpu_can_fuse(const og_fuse_program *p, const og_fuse_step *s) {
    (void)p;
    for (int32_t k = 1; k < s->n; k++)
        if (s->instr[k] != s->instr[0] + k) return false;
    return true;
}

const og_fuse_rules og_fuse_rules_cpu = {
    .patterns = OG_FUSE_BIT(OG_FUSE_GATE_UP) | OG_FUSE_BIT(OG_FUSE_PRODUCTS),
    .max_products = OG_MATMUL_MAX_PARTS,
    .can_fuse = cpu_can_fuse,
};

/* A back end that runs every instruction on its own (the CPU's tensor-parallel
 * mode, backend_cpu_tp.c). */
const og_fuse_rules og_fuse_rules_none = {.patterns = 0, .max_products = 2, .can_fuse = NULL};

/* ------------------------------------------------------------ CUDA */

/* Output features up to which a CUDA product step takes an add + norm
 * prologue: every block of the gemv norms x for itself, worth it for a few
 * waves of blocks, not for a vocabulary-wide product (measured: the
 * prologue cost the logits product 75 us of 94). */
#define CUDA_PROLOGUE_MAX_FEATURES 16384

/* OG_CUDA_PROLOGUE_MAX=<features> sets that bound, for measurements (0: no
 * product step takes a prologue; the add + rms_norm runs as its own launch). */
static int64_t cuda_prologue_max(void) {
    const char *v = getenv("OG_CUDA_PROLOGUE_MAX");
    return v && *v ? atoll(v) : CUDA_PROLOGUE_MAX_FEATURES;
}

static const og_program_tensor *weight_of(const og_fuse_program *p, const og_program_instr *in) {
    return in->in[1].kind == OG_VALUE_TENSOR && p->prog ? og_program_tensor_at(p->prog, in->in[1].index) : NULL;
}

/* Products of one gemv launch: weights of one dtype, all with a bias or
 * none. */
static bool weights_alike(const og_fuse_program *p, const og_program_instr *a, const og_program_instr *b) {
    const og_program_tensor *wa = weight_of(p, a), *wb = weight_of(p, b);
    return wa && wb && wa->dtype == wb->dtype && a->n_in == b->n_in;
}

static bool cuda_can_fuse(const og_fuse_program *p, const og_fuse_step *s) {
    const int32_t *mi = s->instr + s->n_pre, n = s->n - s->n_pre;
    if (s->kind == OG_FUSE_GATE_UP || s->kind == OG_FUSE_PRODUCTS) {
        const int32_t products = s->kind == OG_FUSE_GATE_UP ? 2 : n;
        for (int32_t k = 1; k < products; k++)
            if (!weights_alike(p, p->instr[mi[0]], p->instr[mi[k]])) return false;
    }
    if (!s->n_pre) return true;
    /* a prologue: the gemv of every product norms x itself */
    int64_t features = 0;
    for (int32_t k = 0; k < n; k++) {
        const og_program_instr *in = p->instr[mi[k]];
        if (in->op == OG_OP_MATMUL) features += in->out_width;
    }
    return features <= cuda_prologue_max();
}

const og_fuse_rules og_fuse_rules_cuda = {
    .patterns = OG_FUSE_BIT(OG_FUSE_ADD_NORM) | OG_FUSE_BIT(OG_FUSE_NORM_ROPE) | OG_FUSE_BIT(OG_FUSE_GATE_UP) |
                OG_FUSE_BIT(OG_FUSE_PRODUCTS) | OG_FUSE_BIT(OG_FUSE_PROLOGUE),
    .max_products = OG_GEMV_CUDA_MAX_PARTS,
    .can_fuse = cuda_can_fuse,
};
