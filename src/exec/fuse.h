/* The fusion matcher: finds, once per program, the runs of instructions a
 * back end may execute as one step (one launch, one parallel-for), and cuts
 * the program into the steps a back end runs in order.
 *
 * The matcher knows the patterns and the rules every fusion must keep
 * (operands, readers, the side of the last attention); a back end declares
 * which patterns it runs and may veto a candidate its kernels cannot take
 * (og_fuse_rules: a mask and a predicate, as ggml's backends test
 * ggml_can_fuse before fusing). Both back ends' declarations are here
 * (og_fuse_rules_cpu, og_fuse_rules_cuda), compiled in every build, so that
 * the CUDA plan of a program can be checked without a GPU.
 *
 * The patterns, found in this order (an instruction joins at most one step;
 * an earlier pattern keeps what it found):
 *   OG_FUSE_ADD_NORM    add, then the rms_norm of its sum right after it
 *   OG_FUSE_NORM_ROPE   head_rms_norm, then the rope of its heads, its only
 *                       reader; a pair and the next pair after it on the
 *                       same side of the last attention (q and k) become one
 *                       step of 4 (norm, rope, norm, rope) when the second's
 *                       input exists before the first's norm
 *   OG_FUSE_GATE_UP     two products of one input, read only by the swiglu
 *                       of them (gate, up, swiglu), of one output width
 *   OG_FUSE_PRODUCTS    consecutive products of one input activation (the
 *                       q, k, v projections), up to max_products
 *   OG_FUSE_PROLOGUE    an add + rms_norm step directly followed by a product
 *                       step (products, gate + up, or one product) that
 *                       holds every reader of the normed value, each reading
 *                       it as its x: the add and the norm become the first
 *                       n_pre = 2 instructions of the product step
 * The logits product joins no pattern (it may take a prologue, alone in its
 * step), and no step crosses the last attention (the tail runs on other rows
 * than the instructions before it).
 *
 * Instructions of a step run at the step's place, the place of its first
 * instruction in the program: the matcher only groups instructions whose
 * inputs exist by then.
 */
#ifndef OG_EXEC_FUSE_H
#define OG_EXEC_FUSE_H

#include "core/core.h"
#include "program/program.h"

#include <stdbool.h>
#include <stdint.h>

/* What a step runs. OG_FUSE_ONE is a single instruction (or, with a
 * prologue, one product); OG_FUSE_PROLOGUE is never a step's kind, only a
 * pattern bit. */
typedef enum og_fuse_kind {
    OG_FUSE_ONE = 0,
    OG_FUSE_ADD_NORM,
    OG_FUSE_NORM_ROPE,
    OG_FUSE_GATE_UP,
    OG_FUSE_PRODUCTS,
    OG_FUSE_PROLOGUE,
} og_fuse_kind;

#define OG_FUSE_BIT(kind) (1u << (kind))

/* Products one step may hold (the CPU's og_matmul_rows_multi_cpu takes 8). */
#define OG_FUSE_MAX_PRODUCTS 8
/* Instructions one step may hold: its products and a prologue of two. */
#define OG_FUSE_MAX_INSTRS (OG_FUSE_MAX_PRODUCTS + 2)

/* One step. instr lists its instructions: the prologue's add and rms_norm
 * first (n_pre of them, 0 or 2), then
 *   ONE:       the instruction;
 *   ADD_NORM:  the add, the rms_norm;
 *   NORM_ROPE: head_rms_norm, rope (and a second pair);
 *   GATE_UP:   the gate product, the up product, the swiglu;
 *   PRODUCTS:  the products in program order. */
typedef struct og_fuse_step {
    og_fuse_kind kind;
    int32_t n, n_pre;
    int32_t instr[OG_FUSE_MAX_INSTRS];
} og_fuse_step;

/* The program as the matcher sees it. */
typedef struct og_fuse_program {
    int32_t n_instrs;
    const og_program_instr *const *instr; /* [n_instrs], borrowed */
    int32_t logits_instr;                 /* -1: none */
    int32_t last_attend;                  /* the last op on per-session storage; -1: none */
    const og_program *prog;               /* the tensors, for the back ends' predicates; may be NULL */
} og_fuse_program;

/* What a back end runs. */
typedef struct og_fuse_rules {
    uint32_t patterns;    /* OG_FUSE_BIT of each pattern it runs */
    int32_t max_products; /* in one OG_FUSE_PRODUCTS step, 2 .. OG_FUSE_MAX_PRODUCTS */
    /* Whether the back end runs a candidate the matcher found (NULL: all of
     * them). A run of products is offered one product longer at a time and
     * ends at the first refusal; a prologue is offered as the product step
     * with the add and the norm in front (n_pre = 2). */
    bool (*can_fuse)(const og_fuse_program *p, const og_fuse_step *candidate);
} og_fuse_rules;

extern const og_fuse_rules og_fuse_rules_cpu;
extern const og_fuse_rules og_fuse_rules_none;
extern const og_fuse_rules og_fuse_rules_cuda;

/* Cuts the program into steps under the rules: every instruction in exactly
 * one step; steps in the order of their first instruction. On success
 * *steps ([*n_steps], owned by the caller: og_free) holds them. */
og_status og_fuse_plan(const og_fuse_program *p, const og_fuse_rules *r, og_fuse_step **steps, int32_t *n_steps);

/* The instruction view of a program (instr owned by the caller: og_free). */
og_status og_fuse_program_of(const og_program *prog, int32_t logits_instr, int32_t last_attend, og_fuse_program *out);

/* The value index of the output an operand reads, or -1 (a tensor, an input). */
static inline int32_t og_fuse_producer(og_program_operand o) {
    return o.kind == OG_VALUE_ACTIVATION ? o.index : -1;
}

#endif
