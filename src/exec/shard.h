/* Tensor parallel: how a program is cut across N shards (docs/DESIGN.md
 * section 9). Sharding is a load option: the program file does not change.
 * This planner reads the program once and says, for every instruction, what
 * each shard computes and which slice of each weight it holds; a back end
 * runs the plan (backend_cpu_tp.c: the N shards in one process with an
 * in-memory reduce).
 *
 * Letters: N shards, s one of them; W the full width of a value; W_s the
 * columns of it shard s holds; Hq / Hkv query / kv heads, D their dim, G =
 * Hq / Hkv; Hk / Hv a Gated DeltaNet layer's key / value heads; F an MLP's
 * (or an expert's) intermediate size; V the vocabulary.
 *
 * Every value (instruction output) is stored in one of three layouts:
 *   FULL     every shard holds all W columns (the same bits everywhere);
 *   SPLIT    shard s holds its columns cols[s] of the W (a few ranges, in
 *            order), e.g. its attention heads;
 *   PARTIAL  every shard holds a [T, W] partial sum; the value is their sum
 *            (what a row-parallel product leaves before its all-reduce).
 * and every instruction runs in one of these modes:
 *   REPLICATED    every shard computes it whole from FULL operands (norms,
 *                 residual adds, a MoE router, a product whose x is FULL
 *                 and whose output is wanted FULL);
 *   COLUMNS       a product whose output is split: shard s holds the weight
 *                 rows of its output columns (q, k, v, gate, up, z, a, b:
 *                 column-parallel);
 *   ROWS          a product of a SPLIT x: shard s holds the weight columns
 *                 of its x columns and computes a partial sum (o, down, a
 *                 linear layer's out: row-parallel), all-reduced unless its
 *                 consumer takes partial sums;
 *   HEADS         a per-head or element-wise op on split operands (rope,
 *                 the q / k norms, update_and_attend, swiglu, the attention
 *                 gate, the causal convolution by channel, the gated delta
 *                 rule and its gated norm by value head);
 *   VOCAB_EMBED   embed: shard s holds its rows of the table; a token outside
 *                 them reads zeros; all-reduced (exact: one shard is nonzero);
 *   VOCAB_HEAD    the logits product: shard s holds its vocabulary rows of the
 *                 head; all-gathered into the whole row;
 *   EXPERTS       moe: shard s holds the same slice of every expert's
 *                 intermediate (gate / up rows, down columns); the router's
 *                 picks are the same everywhere; partial sums, all-reduced.
 * A HEADS op whose output a consumer wants FULL is all-gathered after.
 *
 * Heads are cut in two levels (shard.c, cut_heads): attention's kv heads,
 * each with the query heads that read it (a Gated DeltaNet layer's key
 * heads, each with its value heads). With N <= Hkv, shard s takes kv heads
 * [s Hkv / N, (s+1) Hkv / N) and their query heads (uneven when N does not
 * divide Hkv); with more shards than kv heads, the shards of a kv head share
 * it (each writes its rows with the same bits) and split its query heads;
 * with more shards than even those, shards share a query head: each computes
 * it whole and owns part of its D columns, which is what the row-parallel
 * product after it reads. A session's storage keeps its one layout (so a
 * saved session does not depend on N): a shard reads and writes its heads'
 * part of every row.
 *
 * Refused by name (OG_ERR_UNSUPPORTED): a head shared by more shards than it
 * has columns, an intermediate size with fewer quantization blocks than
 * shards, a quantized weight cut off its blocks, and N outside
 * [1, OG_SHARD_MAX]. */
#ifndef OG_EXEC_SHARD_H
#define OG_EXEC_SHARD_H

#include "core/core.h"
#include "program/program.h"

#define OG_SHARD_MAX OG_TENSOR_PARALLEL_MAX
#define OG_SHARD_MAX_RANGES 3

/* The columns of a full-width value a shard holds: ranges [lo, hi) in order;
 * its width is the sum of their lengths. */
typedef struct og_shard_cols {
    int32_t n;
    int64_t lo[OG_SHARD_MAX_RANGES], hi[OG_SHARD_MAX_RANGES];
} og_shard_cols;

static inline int64_t og_shard_cols_width(const og_shard_cols *c) {
    int64_t w = 0;
    for (int32_t i = 0; i < c->n; i++) w += c->hi[i] - c->lo[i];
    return w;
}

typedef enum og_shard_layout { OG_SHARD_FULL = 0, OG_SHARD_SPLIT, OG_SHARD_PARTIAL } og_shard_layout;

typedef enum og_shard_mode {
    OG_SHARD_REPLICATED = 0,
    OG_SHARD_COLUMNS,
    OG_SHARD_ROWS,
    OG_SHARD_HEADS,
    OG_SHARD_VOCAB_EMBED,
    OG_SHARD_VOCAB_HEAD,
    OG_SHARD_EXPERTS
} og_shard_mode;

/* What one instruction's operand j is, as the instruction reads it. */
typedef enum og_shard_take {
    OG_SHARD_TAKE_FULL = 0, /* the whole value (FULL)                       */
    OG_SHARD_TAKE_COLS,     /* shard s's columns of it: in_cols[j][s]       */
    OG_SHARD_TAKE_PARTIAL   /* its partial sums (a moe's shared expert): a
                               FULL value is then added by shard 0 only     */
} og_shard_take;

typedef struct og_shard_instr {
    og_shard_mode mode;
    og_shard_layout layout;         /* of the output as stored after it        */
    bool reduce;                    /* all-reduce of the partial sums after     */
    bool gather;                    /* all-gather of the split output after     */
    og_shard_cols cols[OG_SHARD_MAX];    /* output columns of each shard (SPLIT, or before a gather; VOCAB_HEAD: its vocabulary) */
    og_shard_take take[OG_OP_MAX_INPUTS];
    og_shard_cols in_cols[OG_OP_MAX_INPUTS][OG_SHARD_MAX]; /* operands taken by columns */
    og_op_attrs attrs[OG_SHARD_MAX]; /* each shard's attributes (its heads)    */
    /* update_and_attend: each shard's kv heads [head0, head0 + n_kv_heads);
     * gated_delta_net: its value heads [head0, head0 + v_heads) of the state;
     * VOCAB_EMBED: its vocabulary rows [head0, head0 + rows) */
    int64_t head0[OG_SHARD_MAX];
    /* causal_conv1d: the state's channels each shard holds (its cols) */
} og_shard_instr;

/* One shard's slice of a weight operand: the bytes it reads (owned by the
 * plan, or the program's own when the shard reads the whole tensor), or NULL
 * where it reads none (a row-parallel product's bias beyond shard 0). */
typedef struct og_shard_weight {
    const void *data;
    int64_t rows, cols; /* the slice as a [rows, cols] matrix (rank-3: per expert; rank-1: cols) */
} og_shard_weight;

typedef struct og_shard_plan {
    int32_t n_shards;
    int32_t n_instrs;
    og_shard_instr *instr;   /* [n_instrs] */
    /* [n_instrs][OG_OP_MAX_INPUTS][n_shards]: each weight operand's slice */
    og_shard_weight *weights;
    void **owned;            /* [n_owned] slices allocated by the plan      */
    int32_t n_owned, owned_cap;
    int64_t owned_bytes;     /* their bytes                                */
} og_shard_plan;

/* Plans program p (its logits instruction logits_instr) over n_shards and
 * slices the weights. On success *out is owned by the caller
 * (og_shard_plan_destroy). Fails with OG_ERR_UNSUPPORTED naming the
 * instruction a cut does not fit, or OG_ERR_OUT_OF_MEMORY. */
og_status og_shard_plan_create(const og_program *p, int32_t logits_instr, int32_t n_shards, og_shard_plan **out);
void og_shard_plan_destroy(og_shard_plan *plan);

static inline const og_shard_weight *og_shard_weight_at(const og_shard_plan *plan, int32_t instr, int32_t operand,
                                                        int32_t shard) {
    return &plan->weights[((size_t)instr * OG_OP_MAX_INPUTS + (size_t)operand) * (size_t)plan->n_shards + (size_t)shard];
}

/* Copies the columns cols (NULL: all) of the rows rows (NULL: all) of a
 * [N, K] weight of dtype dt into *out ([rows', cols'] in the same format;
 * owned by the caller: og_free). Quantized formats are cut at their blocks:
 * column ranges must start and end on a block (q8 / q4: 32 elements; the
 * k-quants: 256), else OG_ERR_UNSUPPORTED. The bytes are copied as stored:
 * no value changes. */
og_status og_shard_slice_matrix(og_dtype dt, const void *w, int64_t N, int64_t K, const og_shard_cols *rows,
                                const og_shard_cols *cols, void **out, size_t *nbytes);

#endif /* OG_EXEC_SHARD_H */
