/* The CUDA back end: runs a prepared step (exec.h) with every instruction on
 * the device.
 *
 * A model uploads its weights (as stored: bf16, f32, q8/q4 planes, k-quant
 * blocks) and rope tables once; its launch steps are the model's steps
 * (m->steps: the fusion matcher's plan, exec/fuse.h, under
 * og_fuse_rules_cuda). Sessions keep only their KV storage
 * (og_kv_allocator_cuda_vmm of kv/alloc_cuda.h: flat layers reserve address
 * space once and grow by mapping memory, so their addresses never move;
 * without virtual memory management growth copies on the model's storage
 * stream, which every step waits for first).
 * A step context owns what a step in flight uses: a non-blocking stream,
 * cuBLAS, the attention scratch, and two row sets (row_set): a fixed one,
 * which the decode graphs are captured over and which never moves, and one
 * grown to the widest step the fixed one cannot hold. A row set holds the
 * activation slots ([rows, slot_width] f32 each), the logits of the tail
 * rows and a "step block" in device memory with the rows' tokens and
 * positions and the attention, state and sampler tables, written from
 * pinned host memory at the start of the step.
 *
 * The step's N rows (every session's tokens, in the plan's row order) go
 * through each row-wise launch at once: products stream the weights once
 * for all rows in a gemv up to gemv_rows (OG_GEMV_CUDA_MAX_T; lower with
 * OG_CUDA_GEMV_ROWS), and above it go to cuBLAS: f32 weights by SGEMM; bf16
 * weights, in a bf16 program (its prefill and its batched steps), by one
 * tensor-core product of the activations rounded to bf16 (f32 accumulation:
 * the rounding the CPU's prefill of such a program makes, see
 * og_matmul_bf16_cpu, and what transformers computes in bf16), in an f32
 * program by two bf16 products of the activations split into bf16 hi + lo
 * parts, which keeps them to about 2^-16 relative, close to the CPU's f32
 * products; quantized weights (q8/q4, k-quants: k-quants at every width) as
 * quant_products says.
 * update_and_attend runs per session over its own storage, and so do a
 * hybrid model's state ops (causal_conv1d, gated_delta_net): the one-token
 * sessions of a step in one launch over the step block's tables (KV storage;
 * the committed and the written copy of each session's state), wider steps
 * one launch each. The tail (after the last attention) runs on the rows
 * whose output is wanted, compacted to the front first.
 *
 * Launch steps (og_fuse_step) other than one instruction, at or below the
 * gemv's rows (wider ones run their instructions one by one, except where
 * said):
 *   ADD_NORM   add, rms_norm of its sum: og_add_rms_norm_cuda at every width
 *              (both outputs written)
 *   NORM_ROPE  head_rms_norm and the rope of it, one or two pairs (q and k):
 *              og_head_norm_rope_multi_cuda at every width (the normed heads
 *              get no slot and are never written)
 *   GATE_UP    gate and up products, swiglu: og_gemv_norm_swiglu_cuda (gate
 *              and up are written only by wider steps: one split of x for
 *              both products, then og_swiglu_cuda)
 *   PRODUCTS   products of one input, weights of one dtype (no k-quant):
 *              og_gemv_norm_multi_cuda (wider: one products() call for them
 *              all, one split of x)
 *   a prologue (n_pre = 2): an add + rms_norm folded into the product step
 *              after it; the products' gemv computes the norm itself, and
 *              writes the sum (the normed value is written only where the
 *              gemv does not take the step: then og_add_rms_norm_cuda runs
 *              first)
 * Past the gemv's rows, where a product takes one bf16 product (bf16_step),
 * add_rms_norm, swiglu and the tiled attention write their output's bf16
 * rounding into the split scratch too, and the product that reads it next
 * skips its split launch (hi_copy).
 * The launch steps get their own scratch slot plan (og_exec_plan_slots over
 * launch steps instead of instructions), so a launch never writes a slot
 * another value still needs, whichever instruction of it the program listed
 * first.
 *
 * Outputs: a row with an allowed-token mask (og_batch_item.allowed, a
 * grammar's) has its disallowed logits set to -inf on the device first
 * (og_mask_logits_cuda, in the decode graph: the masks are uploaded with the
 * step block into buffers that never move, so they change without a
 * re-capture); logits rows are copied back; the arg-max, and sampling with
 * what og_sample_cuda_supported accepts, run on the device
 * (og_sample_batch_cuda) and only the token comes back; other samplers draw
 * on the host from the copied logits row. Every step ends with a stream synchronization, so that
 * a failed kernel fails its own step (which then does not commit) and the
 * pinned step block is free for the next one.
 */
#include "exec/exec.h"

#include "kernels/cuda/gdn_cuda.h"
#include "kernels/cuda/kquant_cuda.h"
#include "kernels/cuda/moe_cuda.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/sample_cuda.h"
#include "kv/alloc_cuda.h"
#include "exec/nccl_cuda.h"
#include "exec/profile_cuda.h"
#include "exec/sample.h"
#include "exec/shard.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuBLAS workspace per step context, so that products need no allocation
 * inside a graph capture. */
#define BLAS_WORKSPACE_BYTES ((size_t)32 << 20)
/* Quantized weights in steps wider than the gemv (see quant_products): up
 * to this many gemv launches of the gemv's rows each read the weights (q8:
 * 1 byte a weight per launch, q4 1/2, k-quants their blocks' bytes) before
 * dequantizing to f32 and a cuBLAS product (4 bytes a weight written, then
 * read) is cheaper; and the f32 panel a context dequantizes into holds at
 * most this many floats (a vocabulary-wide head goes in panels of rows, not
 * whole). */
#define QUANT_GEMV_LAUNCHES 4
#define QUANT_PANEL_FLOATS ((int64_t)16 << 20)
/* The tensor-core path's panels (quant_products) hold at least this many
 * rows, a whole matrix where it has no more: a panel of fewer rows (a
 * 12288-wide down projection in 16 M floats is 1365) leaves most SMs idle
 * in its product. */
#define QUANT_SPLIT_MIN_ROWS 4096

/* Rows of a [N, K] quantized weight a panel holds: f32 panels (SGEMM), or
 * bf16 hi + lo panels (split). */
static int64_t quant_panel_rows(int64_t N, int64_t K, bool split) {
    int64_t rows = QUANT_PANEL_FLOATS / K > 1 ? QUANT_PANEL_FLOATS / K : 1;
    if (split && rows < QUANT_SPLIT_MIN_ROWS) rows = QUANT_SPLIT_MIN_ROWS;
    if (split && rows > 32768) rows = 32768; /* og_dequantize_split_cuda: at most 65535 rows a call */
    return N < rows ? N : rows;
}

typedef struct cuda_model {
    int device;
    /* OG_CUDA_NCCL=1: the tensor-parallel path at N = 1 (nccl_cuda.h): an
     * all-reduce of each output the shard planner reduces, after its step */
    og_nccl *nccl;
    bool *all_reduce;   /* [n_instrs], with nccl */
    void **weights;     /* [n_tensors]: device copy of every weight tensor, NULL for runtime ones */
    float *inv_freq;    /* [n_instrs, OG_ROPE_MAX_HEAD_DIM / 2]: rope tables */
    int32_t *slot_of;   /* [n_instrs]: scratch slot of each output, -1 when never written */
    int64_t *slot_width;/* [n_slots] */
    int32_t n_slots;
    int64_t max_k;      /* widest input of a product (the bf16 split scratch) */
    int64_t max_dequant;/* floats of the widest dequantized panel of a quantized weight, 0 when none */
    int64_t max_split;  /* bf16 elements of the widest hi (or lo) panel of the tensor-core path, 0 when none */
    int64_t kq_max_k;   /* widest input of a product with k-quant weights, 0 when none */
    int64_t attend_scratch; /* floats of og_update_and_attend_cuda's scratch */
    /* the widest attention layer, for the batched attention's scratch */
    int32_t max_heads, max_head_dim;
    int64_t max_keys;
    bool attends;       /* the program attends at all (the batched attention's scratch) */
    /* products of more than gemv_rows rows (see the file comment):
     * PRODUCTS_AUTO rounds activations to bf16 in every step of a bf16
     * program, batched or not, and splits them into hi + lo in an f32
     * program's; OG_CUDA_PRODUCTS=split or bf16 in the environment forces
     * hi + lo or bf16 for every step (tests, measurements) */
    enum { PRODUCTS_AUTO, PRODUCTS_SPLIT, PRODUCTS_BF16 } products;
    bool bf16_program; /* activations bf16 (the program's model) */
    /* quantized weights in a step that rounds x to bf16 (bf16_step): as
     * bf16 hi + lo on the tensor cores (QUANT_SPLIT, the default); for
     * measurements, OG_CUDA_QUANT_PRODUCTS=f32: f32 panels and SGEMM, =hi:
     * the weights rounded to one bf16 value (one product; 2^-9) */
    enum { QUANT_SPLIT, QUANT_F32, QUANT_HI } quant_products;
    int64_t gemv_max_t; /* see gemv_rows */
    cudaStream_t store; /* orders the sessions' KV storage copies */
    og_cuda_profile *profile; /* OG_CUDA_PROFILE: device time by launch step (profile_cuda.h) */
} cuda_model;

typedef struct cuda_session {
    og_kv_allocator alloc;
    uint32_t *forbidden_dev;  /* [W] its sampler's forbidden tokens, made on first use */
    uint32_t *forbidden_seen; /* [W] what was uploaded */
    bool forbidden_valid;
} cuda_session;

/* Rows of the widest decode graph (bucket 2^8). */
#define GRAPH_MAX_ROWS 256

/* The step block's int32 arrays: tokens, positions, then the tail's tokens
 * and positions, [cap] each (the tables follow; see layout_of). */
enum { BLOCK_TOKENS = 0, BLOCK_POSITIONS, BLOCK_TAIL_TOKENS, BLOCK_TAIL_POSITIONS, BLOCK_ARRAYS };

typedef struct block_layout {
    size_t table, states, samplers, mask_of, bytes;
} block_layout;

/* Everything a step of up to cap rows (cap_out tail rows) reads and writes
 * on the device. A context's fixed set never moves, so the decode graphs
 * captured over it stay valid; wider steps run in a second set that grows. */
typedef struct row_set {
    int64_t cap, cap_out;
    block_layout layout;
    float **slots;              /* [n_slots] of [cap, slot_width]      */
    unsigned char *block_host;  /* pinned step block                   */
    unsigned char *block_dev;   /* its device copy                     */
    int32_t *next_host;         /* pinned [cap_out]: tokens chosen on the device */
    int32_t *next_dev;          /* [cap_out]                           */
    uint16_t *split_hi, *split_lo; /* [cap * max_k] bf16 parts          */
    float *logits;              /* [cap_out, V] the tail rows' logits  */
    uint32_t *marks;            /* [cap_out, W] sampler scratch, zero between steps */
    /* the allowed-token masks of the step's masked rows (og_batch_item.allowed),
     * packed: the step block's mask_of names each tail row's (k + 1, 0: none).
     * The fixed set's hold cap_out masks from the start and never move (its
     * graphs read them); the growing set's grow to a step's count. */
    uint32_t *masks_host;       /* pinned [mask_cap, W] */
    uint32_t *masks_dev;        /* [mask_cap, W] */
    int64_t mask_cap;
    float *attn_partials;       /* batched attention scratch, counters zero between steps */
    void *moe_scratch;          /* the moe instructions' (og_moe_cuda_scratch_bytes of cap rows) */
    void *kq_x;                 /* x as int8 terms for the k-quant integer gemv (og_kquant_x_cuda_bytes) */
} row_set;

struct og_step_ctx {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_workspace;
    row_set fixed, big;
    float *partials;            /* per-session attention scratch, counters zero between steps */
    float *dequant;             /* [max_dequant] a quantized weight's panel in f32 (wide steps) */
    uint16_t *dequant_split;    /* [2, max_split] a panel as bf16 hi, then lo (quant_products), or NULL */
    int32_t *recent_host;       /* pinned [recent_cap]: the samplers' recent tokens */
    int32_t *recent_dev;
    int64_t recent_cap, recent_used;
    float *host_rows;           /* [host_rows_cap, V] logits rows sampled on the host */
    int64_t host_rows_cap;
    bool device_tokens;         /* this step's sampler kernel has rows to serve */
    int32_t n_masks;            /* this step's masked rows (masks uploaded) */
    og_dtype kv_dtype;          /* the dtype the batched attention of this context serves */
    bool kv_dtype_set;
    cudaGraphExec_t graph[OG_BATCH_BUCKETS]; /* decode graphs over the fixed set */
    /* OG_CUDA_PROFILE: the marks of steps without a graph [0] and of each
     * decode graph [1 + bucket] */
    og_cuda_marks *marks[OG_BATCH_BUCKETS + 1];
};

static cuda_model *cm_of(const og_model *m) { return m->be; }

/* ------------------------------------------------------------ helpers */

static og_status cuda_fail(cudaError_t e, const char *what) {
    og_status st = e == cudaErrorMemoryAllocation ? OG_ERR_OUT_OF_MEMORY : OG_ERR_BACKEND;
    return og_set_error(st, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}
#define CUDA_TRY(call, what)                                                                                       \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) return cuda_fail(e_, what);                                                         \
    } while (0)

static og_status blas_fail(cublasStatus_t e, const char *what) {
    return og_set_error(OG_ERR_BACKEND, "%s: cuBLAS status %d", what, (int)e);
}

static int32_t *block_array(int32_t *block, int64_t cap, int which) { return block + (size_t)which * (size_t)cap; }

/* ------------------------------------------------------------ launch steps */

/* The model's steps (m->steps) are its launch steps: og_fuse_plan under
 * og_fuse_rules_cuda (exec/fuse.h) found them. */

/* Outputs a step writes into slots (into outs): every member's but a
 * NORM_ROPE step's norms (never written) and the logits (their own buffer). */
static int32_t step_outputs(const og_model *m, const og_fuse_step *st, int32_t *outs) {
    int32_t k = 0;
    for (int32_t j = 0; j < st->n; j++) {
        const int32_t i = st->instr[j];
        if (i == m->logits_instr || (st->kind == OG_FUSE_NORM_ROPE && j % 2 == 0)) continue; /* norms stay unwritten */
        outs[k++] = i;
    }
    return k;
}

static bool step_has(const og_fuse_step *st, int32_t i) {
    for (int32_t j = 0; j < st->n; j++)
        if (st->instr[j] == i) return true;
    return false;
}

/* The shared greedy slot plan (og_exec_plan_slots) over launch steps: a
 * value is defined by the step that writes it and last read by the latest
 * other step reading it; fused norms and the logits get no slot. */
static og_status plan_step_slots(og_model *m, cuda_model *cm) {
    const int32_t n = m->n_instrs;
    int32_t *def = og_malloc((size_t)n * sizeof *def), *last = og_malloc((size_t)n * sizeof *last);
    int64_t *width = og_malloc((size_t)n * sizeof *width);
    cm->slot_of = og_malloc((size_t)n * sizeof *cm->slot_of);
    cm->slot_width = og_calloc((size_t)n, sizeof *cm->slot_width);
    og_status st = OG_OK;
    if (!def || !last || !width || !cm->slot_of || !cm->slot_width) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the step plan");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) def[i] = 0, last[i] = -1, width[i] = -1;
    for (int32_t k = 0; k < m->n_steps; k++) {
        const og_fuse_step *sp = &m->steps[k];
        int32_t outs[OG_FUSE_MAX_INSTRS];
        const int32_t n_out = step_outputs(m, sp, outs);
        for (int32_t o = 0; o < n_out; o++) {
            def[outs[o]] = k;
            width[outs[o]] = og_program_instr_at(m->prog, outs[o])->out_width;
        }
        for (int32_t j = 0; j < sp->n; j++) {
            const og_program_instr *in = og_program_instr_at(m->prog, sp->instr[j]);
            for (int32_t o = 0; o < in->n_in; o++) {
                const int32_t p = og_fuse_producer(in->in[o]);
                if (p >= 0 && !step_has(sp, p)) last[p] = k;
            }
        }
    }
    st = og_exec_plan_slots(n, m->n_steps, def, last, width, cm->slot_of, cm->slot_width, &cm->n_slots);
done:
    og_free(def);
    og_free(last);
    og_free(width);
    return st;
}

/* ------------------------------------------------------------ models */

static void cuda_model_free(og_model *m) {
    cuda_model *cm = m->be;
    if (!cm) return;
    if (cm->weights)
        for (int32_t i = 0; i < og_program_n_tensors(m->prog); i++) cudaFree(cm->weights[i]);
    cudaFree(cm->inv_freq);
    if (cm->store) cudaStreamDestroy(cm->store);
    og_nccl_close(cm->nccl);
    og_cuda_profile_close(cm->profile);
    og_free(cm->all_reduce);
    og_free(cm->weights);
    og_free(cm->slot_of);
    og_free(cm->slot_width);
    og_free(cm);
    m->be = NULL;
}

/* A family of kernels the environment turns off by name (NAME=0): the
 * hybrid models' state kernels (OG_CUDA_HYBRID) and the mixture-of-experts
 * kernels (OG_CUDA_MOE), on by default since they passed their GPU tests and
 * parity; off, such a program is refused by name rather than run. */
static bool kernels_allowed(const char *name) {
    const char *v = getenv(name);
    return !v || strcmp(v, "0") != 0;
}

/* OG_CUDA_NCCL=1: the tensor-parallel path at N = 1 (nccl_cuda.h): a
 * communicator of this one GPU, and which outputs the shard planner reduces. */
static og_status nccl_path(og_model *m, cuda_model *cm) {
    og_shard_plan *plan = NULL;
    OG_TRY(og_shard_plan_create(m->prog, m->logits_instr, 1, &plan));
    cm->all_reduce = og_calloc((size_t)m->n_instrs, sizeof *cm->all_reduce);
    if (!cm->all_reduce) {
        og_shard_plan_destroy(plan);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    }
    for (int32_t i = 0; i < m->n_instrs; i++) cm->all_reduce[i] = plan->instr[i].reduce;
    og_shard_plan_destroy(plan);
    return og_nccl_open(1, &cm->device, &cm->nccl);
}

static og_status cuda_model_init(og_model *m, const og_model_params *p) {
    (void)p;
    if (!og_cuda_device_present()) return og_set_error(OG_ERR_NO_DEVICE, "no CUDA device is present");
    /* kernel families turned off: refused before any weight is uploaded */
    const bool moe_on = kernels_allowed("OG_CUDA_MOE"), hybrid_on = kernels_allowed("OG_CUDA_HYBRID");
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_op op = og_program_instr_at(m->prog, i)->op;
        if (op == OG_OP_MOE && !moe_on)
            return og_set_error(OG_ERR_UNSUPPORTED, "instruction %d (moe): the CUDA mixture-of-experts kernels are "
                                "turned off (OG_CUDA_MOE=0); run this program on the CPU (--backend cpu)", i);
        if ((op == OG_OP_CAUSAL_CONV1D || op == OG_OP_GATED_DELTA_NET) && !hybrid_on)
            return og_set_error(OG_ERR_UNSUPPORTED,
                                "instruction %d (%s): the CUDA kernels of hybrid (Gated DeltaNet) models are turned "
                                "off (OG_CUDA_HYBRID=0); run this program on the CPU (--backend cpu)",
                                (int)i, og_op_get(op)->name);
    }
    cuda_model *cm = og_calloc(1, sizeof *cm);
    if (!cm) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    m->be = cm;
    if (p->n_devices > 0) { /* og_model_load checked the list; the ordinal is the device's to check */
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
        if (p->devices[0] >= count)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "device %d: this machine has %d CUDA device%s (0 to %d)",
                                p->devices[0], count, count == 1 ? "" : "s", count - 1);
        CUDA_TRY(cudaSetDevice(p->devices[0]), "cudaSetDevice");
    }
    CUDA_TRY(cudaGetDevice(&cm->device), "cudaGetDevice");
    CUDA_TRY(cudaStreamCreateWithFlags(&cm->store, cudaStreamNonBlocking), "cudaStreamCreate");
    const char *products_env = getenv("OG_CUDA_PRODUCTS");
    cm->products = !products_env || !*products_env   ? PRODUCTS_AUTO
                   : !strcmp(products_env, "bf16")  ? PRODUCTS_BF16
                   : !strcmp(products_env, "split") ? PRODUCTS_SPLIT
                                                    : PRODUCTS_AUTO;
    if (products_env && *products_env && cm->products == PRODUCTS_AUTO)
        OG_WARN("OG_CUDA_PRODUCTS=%s: expected split or bf16; using the default", products_env);
    cm->bf16_program = og_program_get_model(m->prog)->activation_dtype == OG_DTYPE_BF16;
    const char *quant_env = getenv("OG_CUDA_QUANT_PRODUCTS");
    cm->quant_products = !quant_env || !*quant_env     ? QUANT_SPLIT
                         : !strcmp(quant_env, "f32") ? QUANT_F32
                         : !strcmp(quant_env, "hi")  ? QUANT_HI
                                                     : QUANT_SPLIT;
    if (quant_env && *quant_env && cm->quant_products == QUANT_SPLIT && strcmp(quant_env, "split") != 0)
        OG_WARN("OG_CUDA_QUANT_PRODUCTS=%s: expected f32 or hi; using the default", quant_env);
    const char *gemv_env = getenv("OG_CUDA_GEMV_ROWS");
    cm->gemv_max_t = OG_GEMV_CUDA_MAX_T;
    if (gemv_env && atoi(gemv_env) >= 0 && atoi(gemv_env) < OG_GEMV_CUDA_MAX_T) cm->gemv_max_t = atoi(gemv_env);
    const char *nccl_env = getenv("OG_CUDA_NCCL");
    if (nccl_env && !strcmp(nccl_env, "1")) OG_TRY(nccl_path(m, cm));
    OG_TRY(og_cuda_profile_open(getenv("OG_CUDA_PROFILE"), &cm->profile));
    const int32_t n_tensors = og_program_n_tensors(m->prog);
    cm->weights = og_calloc((size_t)n_tensors, sizeof *cm->weights);
    if (!cm->weights) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
    for (int32_t i = 0; i < n_tensors; i++) {
        const og_program_tensor *t = og_program_tensor_at(m->prog, i);
        if (t->binding != OG_BINDING_WEIGHT || t->nbytes == 0) continue;
        char what[160];
        snprintf(what, sizeof what, "uploading weight %s (%llu bytes)", t->name, (unsigned long long)t->nbytes);
        /* one allocation per tensor, so every tensor starts 256-byte aligned
         * (cudaMalloc); a q8/q4 tensor (og_tensor_bytes: its quants, then its
         * scales) then has every group 16-byte aligned, as the quantized
         * kernels' vector loads need: rows of K/2 or K bytes with K a
         * multiple of 32 are multiples of 16 bytes */
        CUDA_TRY(cudaMalloc(&cm->weights[i], (size_t)t->nbytes), what);
        if (og_dtype_is_quantized(t->dtype) && ((uintptr_t)cm->weights[i] & 15u))
            return og_set_error(OG_ERR_BACKEND, "%s: the device copy is not 16-byte aligned", what);
        CUDA_TRY(cudaMemcpy(cm->weights[i], t->data, (size_t)t->nbytes, cudaMemcpyHostToDevice), what);
    }
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_op op = og_program_instr_at(m->prog, i)->op;
        if (op == OG_OP_GATED_DELTA_NET) { /* the kernels' shared memory, allowed before any capture */
            const og_op_attrs *a = &og_program_instr_at(m->prog, i)->attrs;
            OG_TRY(og_gated_delta_net_cuda_prepare(a->k_head_dim, a->v_head_dim));
        }
    }
    const size_t per = OG_ROPE_MAX_HEAD_DIM / 2;
    CUDA_TRY(cudaMalloc((void **)&cm->inv_freq, (size_t)m->n_instrs * per * sizeof(float)), "rope tables");
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        if (in->op == OG_OP_ROPE)
            CUDA_TRY(cudaMemcpy(cm->inv_freq + (size_t)i * per, m->rope[i].inv_freq, per * sizeof(float),
                                cudaMemcpyHostToDevice),
                     "rope tables");
        if (in->op == OG_OP_UPDATE_AND_ATTEND) {
            const og_kv_layer_config *l = &og_program_kv_config(m->prog)->layers[in->kv_index];
            const int64_t f = og_attend_cuda_scratch_floats((int32_t)in->attrs.n_heads, l->head_dim);
            if (f > cm->attend_scratch) cm->attend_scratch = f;
            const og_kv_config *kv = og_program_kv_config(m->prog);
            const int64_t keys = l->policy == OG_KV_RING ? l->window : kv->max_capacity;
            if (in->attrs.n_heads > cm->max_heads) cm->max_heads = (int32_t)in->attrs.n_heads;
            if (l->head_dim > cm->max_head_dim) cm->max_head_dim = l->head_dim;
            if (keys > cm->max_keys) cm->max_keys = keys;
            cm->attends = true;
        }
        if (in->op == OG_OP_MATMUL && in->in[0].kind == OG_VALUE_ACTIVATION) {
            const int64_t K = og_program_instr_at(m->prog, in->in[0].index)->out_width;
            if (K > cm->max_k) cm->max_k = K;
            const og_program_tensor *w =
                in->in[1].kind == OG_VALUE_TENSOR ? og_program_tensor_at(m->prog, in->in[1].index) : NULL;
            if (w && og_dtype_is_quantized(w->dtype)) {
                const int64_t N = w->shape[0], floats = quant_panel_rows(N, K, false) * K,
                              split = quant_panel_rows(N, K, true) * K;
                if (floats > cm->max_dequant) cm->max_dequant = floats;
                if (split > cm->max_split) cm->max_split = split;
                if (og_dtype_is_kquant(w->dtype) && K > cm->kq_max_k) cm->kq_max_k = K;
            }
        }
    }
    /* The uploads above ran on the default (legacy) stream, which the steps'
     * non-blocking streams do not wait for, and cudaMemcpy from pageable
     * memory may return before its DMA lands: wait for them here, so that no
     * step reads a weight or a rope table still on its way. */
    CUDA_TRY(cudaStreamSynchronize(0), "weight uploads");
    return plan_step_slots(m, cm);
}

/* ------------------------------------------------------------ sessions */

static og_status cuda_session_init(og_session *s) {
    if (s->kv_alloc)
        return og_set_error(OG_ERR_UNSUPPORTED, "og_session_create: the CUDA back end keeps its sessions' KV storage "
                                                "in device memory of its own; kv_allocator must be NULL");
    cuda_session *cs = og_calloc(1, sizeof *cs);
    if (!cs) return og_set_error(OG_ERR_OUT_OF_MEMORY, "cuda session: no memory");
    s->be = cs;
    CUDA_TRY(cudaSetDevice(cm_of(s->m)->device), "cudaSetDevice");
    OG_TRY(og_kv_allocator_cuda_vmm(cm_of(s->m)->store, &cs->alloc));
    return og_kv_session_create(&s->cfg, &cs->alloc, &s->kv);
}

static void cuda_session_free(og_session *s) {
    cuda_session *cs = s->be;
    if (!cs) return;
    cudaSetDevice(cm_of(s->m)->device);
    og_kv_session_destroy(s->kv); /* frees storage on the model's storage stream */
    s->kv = NULL;
    cudaStreamSynchronize(cm_of(s->m)->store);
    og_kv_allocator_cuda_release(&cs->alloc);
    cudaFree(cs->forbidden_dev);
    og_free(cs->forbidden_seen);
    og_free(cs);
    s->be = NULL;
}

/* ------------------------------------------------------------ contexts */

/* The step block, in pinned host memory and its device copy, for a row set
 * of `cap` rows and `cap_out` tail rows:
 *   int32 tokens, positions, tail tokens, tail positions   [cap] each
 *   og_attend_cuda_seq table                               [n_layers, cap]
 *   og_state_cuda_seq table                                [n_states, cap]
 *   og_sample_cuda_row rows                                [cap_out]
 *   int32 mask_of: the mask of each tail row (k + 1; 0: none) [cap_out]
 * The attention kernels, the masking and the sampler read the tables at run
 * time, so a graph captured over a row set serves any sessions (and masks)
 * the host writes there. */
static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static block_layout layout_of(int32_t n_layers, int32_t n_states, int64_t cap, int64_t cap_out) {
    block_layout b;
    b.table = align16((size_t)BLOCK_ARRAYS * (size_t)cap * sizeof(int32_t));
    b.states = align16(b.table + (size_t)n_layers * (size_t)cap * sizeof(og_attend_cuda_seq));
    b.samplers = align16(b.states + (size_t)n_states * (size_t)cap * sizeof(og_state_cuda_seq));
    b.mask_of = align16(b.samplers + (size_t)cap_out * sizeof(og_sample_cuda_row));
    b.bytes = b.mask_of + (size_t)cap_out * sizeof(int32_t);
    return b;
}

static void free_set(og_model *m, row_set *r) {
    if (r->slots)
        for (int32_t i = 0; i < cm_of(m)->n_slots; i++) cudaFree(r->slots[i]);
    og_free(r->slots);
    cudaFreeHost(r->block_host);
    cudaFree(r->block_dev);
    cudaFreeHost(r->next_host);
    cudaFree(r->next_dev);
    cudaFree(r->split_hi);
    cudaFree(r->split_lo);
    cudaFree(r->logits);
    cudaFree(r->marks);
    cudaFreeHost(r->masks_host);
    cudaFree(r->masks_dev);
    cudaFree(r->attn_partials);
    cudaFree(r->moe_scratch);
    cudaFree(r->kq_x);
    memset(r, 0, sizeof *r);
}

/* A row set of cap rows and cap_out tail rows; on failure *r is empty. */
static og_status make_set(og_model *m, row_set *r, int64_t cap, int64_t cap_out) {
    const cuda_model *cm = cm_of(m);
    const og_kv_config *kv = og_program_kv_config(m->prog);
    memset(r, 0, sizeof *r);
    r->cap = cap;
    r->cap_out = cap_out;
    r->layout = layout_of(kv->n_layers, kv->n_states, cap, cap_out);
    og_status st = OG_OK;
#define SET_TRY(call, what)                                                                                        \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            st = cuda_fail(e_, what);                                                                              \
            goto fail;                                                                                             \
        }                                                                                                          \
    } while (0)
    if (!(r->slots = og_calloc((size_t)(cm->n_slots > 0 ? cm->n_slots : 1), sizeof *r->slots))) {
        st = og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory");
        goto fail;
    }
    for (int32_t i = 0; i < cm->n_slots; i++)
        SET_TRY(cudaMalloc((void **)&r->slots[i], (size_t)cap * (size_t)cm->slot_width[i] * sizeof(float)),
                "activation slots");
    SET_TRY(cudaMallocHost((void **)&r->block_host, r->layout.bytes), "pinned step block");
    SET_TRY(cudaMalloc((void **)&r->block_dev, r->layout.bytes), "step block");
    memset(r->block_host, 0, r->layout.bytes);
    SET_TRY(cudaMallocHost((void **)&r->next_host, (size_t)cap_out * sizeof(int32_t)), "pinned tokens");
    SET_TRY(cudaMalloc((void **)&r->next_dev, (size_t)cap_out * sizeof(int32_t)), "tokens");
    if (cap > OG_GEMV_CUDA_MAX_T && cm->max_k > 0) {
        const size_t parts = (size_t)cap * (size_t)cm->max_k * sizeof(uint16_t);
        SET_TRY(cudaMalloc((void **)&r->split_hi, parts), "matmul scratch");
        SET_TRY(cudaMalloc((void **)&r->split_lo, parts), "matmul scratch");
    }
    SET_TRY(cudaMalloc((void **)&r->logits, (size_t)cap_out * (size_t)m->vocab * sizeof(float)), "logits");
    size_t moe_bytes = 0;
    for (int32_t i = 0; i < m->n_instrs; i++) {
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        if (in->op != OG_OP_MOE) continue;
        const og_program_tensor *gu = og_program_tensor_at(m->prog, in->in[2].index);
        const size_t b = og_moe_cuda_scratch_bytes(cap, (int32_t)in->attrs.top_k, gu->shape[0], gu->shape[2],
                                                   gu->shape[1] / 2);
        if (b == 0) {
            st = og_set_error(OG_ERR_INVALID_ARGUMENT, "moe scratch of %lld rows overflows", (long long)cap);
            goto fail;
        }
        if (b > moe_bytes) moe_bytes = b;
    }
    if (moe_bytes) SET_TRY(cudaMalloc(&r->moe_scratch, moe_bytes), "moe scratch");
    if (cm->kq_max_k > 0)
        SET_TRY(cudaMalloc(&r->kq_x, og_kquant_x_cuda_bytes(OG_KQUANT_GEMV_CUDA_MAX_T, cm->kq_max_k)),
                "k-quant x scratch");
    const size_t marks = (size_t)cap_out * og_sample_cuda_marks_bytes(m->vocab);
    SET_TRY(cudaMalloc((void **)&r->marks, marks), "sampler scratch");
    SET_TRY(cudaMemset(r->marks, 0, marks), "sampler scratch");
    /* masks for every tail row of a graph (the fixed set: its addresses are
     * captured); a wider set starts with as many and grows (reserve_masks) */
    r->mask_cap = cap_out < GRAPH_MAX_ROWS ? cap_out : GRAPH_MAX_ROWS;
    SET_TRY(cudaMallocHost((void **)&r->masks_host, (size_t)r->mask_cap * og_sample_cuda_marks_bytes(m->vocab)),
            "pinned token masks");
    SET_TRY(cudaMalloc((void **)&r->masks_dev, (size_t)r->mask_cap * og_sample_cuda_marks_bytes(m->vocab)),
            "token masks");
    if (cm->attends) { /* counters start at zero; every step leaves them so */
        const size_t floats = (size_t)og_attend_batch_cuda_scratch_floats((int32_t)cap, cm->max_heads, cm->max_head_dim,
                                                                         cm->max_keys);
        SET_TRY(cudaMalloc((void **)&r->attn_partials, floats * sizeof(float)), "batched attention scratch");
        SET_TRY(cudaMemset(r->attn_partials, 0, floats * sizeof(float)), "batched attention scratch");
    }
    /* cudaMemset is asynchronous, on the default (legacy) stream, which the
     * steps' non-blocking streams do not wait for: a step must not find the
     * counters before they are zero */
    SET_TRY(cudaStreamSynchronize(0), "zeroing the step scratch");
#undef SET_TRY
    return OG_OK;
fail:
    free_set(m, r);
    return st;
}

static void drop_graphs(og_step_ctx *c) {
    for (int b = 0; b < OG_BATCH_BUCKETS; b++) {
        if (c->graph[b]) cudaGraphExecDestroy(c->graph[b]);
        c->graph[b] = NULL;
    }
}

static void cuda_ctx_free(og_model *m, og_step_ctx *c) {
    if (!c) return;
    cudaSetDevice(cm_of(m)->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    drop_graphs(c);
    for (int32_t i = 0; i <= OG_BATCH_BUCKETS; i++) og_cuda_marks_free(c->marks[i]);
    free_set(m, &c->fixed);
    free_set(m, &c->big);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_workspace);
    cudaFree(c->partials);
    cudaFree(c->dequant);
    cudaFree(c->dequant_split);
    cudaFreeHost(c->recent_host);
    cudaFree(c->recent_dev);
    og_free(c->host_rows);
    if (c->stream) cudaStreamDestroy(c->stream);
    og_free(c);
}

static og_status ctx_init(og_model *m, og_step_ctx *c) {
    const cuda_model *cm = cm_of(m);
    CUDA_TRY(cudaSetDevice(cm->device), "cudaSetDevice");
    CUDA_TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        return blas_fail(bs, "cublasCreate");
    }
    if ((bs = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "cublasSetStream");
    CUDA_TRY(cudaMalloc(&c->blas_workspace, BLAS_WORKSPACE_BYTES), "cuBLAS workspace");
    if ((bs = cublasSetWorkspace(c->blas, c->blas_workspace, BLAS_WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS)
        return blas_fail(bs, "cublasSetWorkspace");
    if (cm->attend_scratch > 0) { /* its split counters start at zero; every step leaves them so */
        CUDA_TRY(cudaMalloc((void **)&c->partials, (size_t)cm->attend_scratch * sizeof(float)), "attention scratch");
        CUDA_TRY(cudaMemset(c->partials, 0, (size_t)cm->attend_scratch * sizeof(float)), "attention scratch");
        /* on the default stream, asynchronous: done before c->stream (non-blocking) may read the counters */
        CUDA_TRY(cudaStreamSynchronize(0), "attention scratch");
    }
    if (cm->max_dequant > 0) /* once, for the widest panel: products of every width share it */
        CUDA_TRY(cudaMalloc((void **)&c->dequant, (size_t)cm->max_dequant * sizeof(float)), "dequantized weights");
    if (cm->max_dequant > 0 && cm->quant_products != QUANT_F32 && (cm->bf16_program || cm->products == PRODUCTS_BF16))
        CUDA_TRY(cudaMalloc((void **)&c->dequant_split, (size_t)cm->max_split * 2 * sizeof(uint16_t)),
                 "dequantized weights as bf16 hi + lo");
    /* the rows of the widest decode graph, or of a max_write step */
    const int64_t mw = og_program_kv_config(m->prog)->max_write;
    return make_set(m, &c->fixed, mw > GRAPH_MAX_ROWS ? mw : GRAPH_MAX_ROWS, GRAPH_MAX_ROWS);
}

static og_status cuda_ctx_create(og_model *m, og_step_ctx **out) {
    og_step_ctx *c = og_calloc(1, sizeof *c);
    if (!c) return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for a step context");
    og_status st = ctx_init(m, c);
    if (st != OG_OK) {
        cuda_ctx_free(m, c);
        return st;
    }
    *out = c;
    return OG_OK;
}

/* The row set a step of `rows` rows and `out` tail rows runs in: the fixed
 * one when it fits (graphs live there), else the growing one. */
static og_status pick_set(og_model *m, og_step_ctx *c, int64_t rows, int64_t out, row_set **set) {
    if (rows <= c->fixed.cap && out <= c->fixed.cap_out) {
        *set = &c->fixed;
        return OG_OK;
    }
    if (rows > c->big.cap || out > c->big.cap_out) {
        const int64_t cap = rows > c->big.cap ? (rows > 2 * c->big.cap ? rows : 2 * c->big.cap) : c->big.cap;
        const int64_t cap_out = out > c->big.cap_out ? out : c->big.cap_out;
        free_set(m, &c->big);
        OG_TRY(make_set(m, &c->big, cap, cap_out));
    }
    *set = &c->big;
    return OG_OK;
}

/* Room for n masks in row set r. Only the growing set ever grows: a step in
 * the fixed one has at most its cap_out tail rows, as many as it has masks,
 * so the addresses its graphs captured never change. */
static og_status reserve_masks(og_model *m, row_set *r, int64_t n) {
    if (n <= r->mask_cap) return OG_OK;
    const size_t bytes = (size_t)n * og_sample_cuda_marks_bytes(m->vocab);
    cudaFreeHost(r->masks_host);
    cudaFree(r->masks_dev);
    r->masks_host = NULL;
    r->masks_dev = NULL;
    r->mask_cap = 0;
    CUDA_TRY(cudaMallocHost((void **)&r->masks_host, bytes), "pinned token masks");
    CUDA_TRY(cudaMalloc((void **)&r->masks_dev, bytes), "token masks");
    r->mask_cap = n;
    return OG_OK;
}

/* Room for n recent-token ids of the samplers in pinned and device memory. */
static og_status reserve_recent(og_step_ctx *c, int64_t n) {
    if (n <= c->recent_cap) return OG_OK;
    cudaFreeHost(c->recent_host);
    cudaFree(c->recent_dev);
    c->recent_host = NULL;
    c->recent_dev = NULL;
    c->recent_cap = 0;
    CUDA_TRY(cudaMallocHost((void **)&c->recent_host, (size_t)n * sizeof(int32_t)), "pinned recent tokens");
    CUDA_TRY(cudaMalloc((void **)&c->recent_dev, (size_t)n * sizeof(int32_t)), "recent tokens");
    c->recent_cap = n;
    return OG_OK;
}

static og_status reserve_host_rows(og_model *m, og_step_ctx *c, int64_t n) {
    if (n <= c->host_rows_cap) return OG_OK;
    og_free(c->host_rows);
    c->host_rows_cap = 0;
    if (!(c->host_rows = og_malloc((size_t)n * (size_t)m->vocab * sizeof(float))))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for %lld logits rows", (long long)n);
    c->host_rows_cap = n;
    return OG_OK;
}

/* ------------------------------------------------------------ one step */

/* The value whose bf16 rounding rs->split_hi holds, written by the kernel
 * that made the value (add_rms_norm, swiglu, tiled attention) so that the
 * product reading it skips its split launch: `of` for the launch step
 * running, `next` set by it for the step after. Only that step may use it
 * (a later one may find another value in the same slot). */
typedef struct hi_copy {
    const float *of, *next;
} hi_copy;

typedef struct step_run {
    og_model *m;
    og_step_ctx *c;
    row_set *rs;    /* the row set the step runs in */
    const og_step_plan *plan;
    int32_t B;      /* a decode graph's bucket rows (padded), else 0 */
    bool tail;      /* running the tail: rows are the tail's rows */
    int64_t rows;   /* rows of the current phase */
    hi_copy *hi;    /* set while enqueue_compute runs */
    og_cuda_marks *marks; /* OG_CUDA_PROFILE: this step's recording, else NULL */
} step_run;

/* Device table of attention layer (manifest index) l. */
static const og_attend_cuda_seq *table_dev(const row_set *r, int32_t l) {
    return (const og_attend_cuda_seq *)(const void *)(r->block_dev + r->layout.table) + (size_t)l * (size_t)r->cap;
}

/* Device table of state (manifest index) s. */
static const og_state_cuda_seq *states_dev(const row_set *r, int32_t s) {
    return (const og_state_cuda_seq *)(const void *)(r->block_dev + r->layout.states) + (size_t)s * (size_t)r->cap;
}

static const void *operand_dev(const step_run *x, og_program_operand o, int64_t *width, og_dtype *dtype) {
    const og_model *m = x->m;
    const row_set *r = x->rs;
    if (o.kind == OG_VALUE_TENSOR) {
        const og_program_tensor *t = og_program_tensor_at(m->prog, o.index);
        *dtype = t->dtype;
        *width = t->rank >= 2 ? t->shape[t->rank - 1] : t->shape[0];
        return cm_of(m)->weights[o.index];
    }
    *dtype = OG_DTYPE_F32;
    if (o.kind == OG_VALUE_INPUT) {
        *width = 1;
        const int which = (o.index == OG_INPUT_TOKENS ? BLOCK_TOKENS : BLOCK_POSITIONS) + (x->tail ? 2 : 0);
        return block_array((int32_t *)(void *)r->block_dev, r->cap, which);
    }
    *width = og_program_instr_at(m->prog, o.index)->out_width;
    const int32_t slot = cm_of(m)->slot_of[o.index];
    return slot >= 0 ? r->slots[slot] : NULL; /* NULL: a fused step's unwritten value */
}

/* Rows up to which products stream the weights in a gemv (at most
 * OG_GEMV_CUDA_MAX_T; OG_CUDA_GEMV_ROWS in the environment lowers it, for
 * measurements). */
static int64_t gemv_rows(const step_run *x) { return cm_of(x->m)->gemv_max_t; }

/* True when a wide product of this step rounds its activations to bf16
 * (one tensor-core product) rather than splitting them (two): in a bf16
 * program, whose activations are bf16 by its model, at every width past
 * the gemv's rows. A row's logits then depend on the step's width within
 * the bf16-activation bound of tests/cli_parity.sh (test_exec_cuda checks
 * batches against it); rows of a step within the gemv keep f32 x. */
static bool bf16_step(const step_run *x) {
    const cuda_model *cm = cm_of(x->m);
    if (cm->products != PRODUCTS_AUTO) return cm->products == PRODUCTS_BF16;
    return cm->bf16_program;
}

/* Quantized weights: q8/q4 in a step wider than the gemv, k-quants at every
 * width (kquant_cuda.h's kernels, chunks of at most OG_KQUANT_GEMV_CUDA_MAX_T
 * rows):
 *  - q8/q4 in a step that rounds x to bf16 (bf16_step), up to
 *    OG_GEMM_NARROW_CUDA_MAX_T rows: og_gemm_narrow_cuda, the quants read
 *    once for every row and every part;
 *  - up to QUANT_GEMV_LAUNCHES x the gemv's rows: the gemv on chunks of
 *    rows, reading the weights once per chunk;
 *  - wider: each weight dequantized, a panel of rows at a time, into the
 *    context's f32 scratch (og_dequantize_cuda) and multiplied by SGEMM.
 *    f32 and not bf16: scale * q needs up to 18 significant bits (the f16
 *    scale's 11 times q's 7), which f32 holds exactly and bf16 (8 bits) does
 *    not, so the product keeps the f32-weight path's precision (the exact
 *    weights, f32 x, f32 sums) and agrees with the gemv and the CPU to
 *    summation order; bf16 weights would move each by up to 2^-9.
 *  - wider, in a step that rounds x to bf16 (bf16_step: a bf16 program's
 *    steps): each panel dequantized straight to bf16 hi + lo
 *    (og_dequantize_split_cuda: the weights to about 2^-16) and two
 *    tensor-core products of bf16(x), W.hi + W.lo: what the CPU's prefill of
 *    such a program computes (og_matmul_bf16_cpu), at tensor-core speed.
 * Biases beside quantized weights are f32. */
static og_status quant_products(const step_run *x, const float *in, og_dtype dt, int64_t T, int64_t K,
                                const og_gemv_cuda_part *parts, int n) {
    og_step_ctx *c = x->c;
    const bool kq = og_dtype_is_kquant(dt); /* k-quants: kquant_cuda.h's gemv and dequantization */
    const int64_t rows_max = kq ? OG_KQUANT_GEMV_CUDA_MAX_T : OG_GEMV_CUDA_MAX_T;
    const int64_t chunk = gemv_rows(x) < rows_max ? gemv_rows(x) : rows_max;
    if (kq && chunk > 0 && T <= QUANT_GEMV_LAUNCHES * chunk) {
        /* the integer gemv unless OG_CUDA_KQUANT_GEMV=f32x: x
         * written once as int8 terms for all the parts */
        void *xq = x->rs->kq_x;
        const bool int8 = xq && K <= cm_of(x->m)->kq_max_k && og_kquant_gemv_cuda_int8_takes(dt) &&
                          og_kquant_gemv_cuda_int8_wanted();
        for (int64_t t0 = 0; t0 < T; t0 += chunk) {
            const int64_t tc = T - t0 < chunk ? T - t0 : chunk;
            og_gemv_cuda_part pc[OG_GEMV_CUDA_MAX_PARTS];
            for (int k = 0; k < n; k++) {
                pc[k] = parts[k];
                pc[k].out = parts[k].out + t0 * parts[k].N; /* rows t0.. of [T, N] */
            }
            if (int8) {
                OG_TRY(og_kquant_gemv_x_multi_cuda(c->stream, in + t0 * K, NULL, xq, dt, tc, K, pc, n));
                continue;
            }
            for (int k = 0; k < n; k++)
                OG_TRY(og_kquant_gemv_cuda(c->stream, in + t0 * K, pc[k].weight, pc[k].bias, dt, tc, K, pc[k].N,
                                           pc[k].out));
        }
        return OG_OK;
    }
    if (!kq && T > gemv_rows(x) && bf16_step(x) && og_gemm_narrow_cuda_wanted(dt, parts, n) &&
        og_gemm_narrow_cuda_takes(x->rs->split_hi, dt, T, K, parts, n)) { /* bf16(x), the weights read once */
        if (!(x->hi && x->hi->of == in)) OG_TRY(og_split_bf16_cuda(c->stream, in, T * K, x->rs->split_hi, NULL));
        return og_gemm_narrow_cuda(c->stream, x->rs->split_hi, dt, T, K, parts, n);
    }
    if (chunk > 0 && T <= QUANT_GEMV_LAUNCHES * chunk) {
        for (int64_t t0 = 0; t0 < T; t0 += chunk) {
            og_gemv_cuda_part pc[OG_GEMV_CUDA_MAX_PARTS];
            for (int k = 0; k < n; k++) {
                pc[k] = parts[k];
                pc[k].out = parts[k].out + t0 * parts[k].N; /* rows t0.. of [T, N] */
            }
            OG_TRY(og_gemv_multi_cuda(c->stream, in + t0 * K, dt, T - t0 < chunk ? T - t0 : chunk, K, pc, n));
        }
        return OG_OK;
    }
    if (!c->dequant)
        return og_set_error(OG_ERR_UNSUPPORTED, "matmul: no dequantization scratch for a %s weight of K = %lld",
                            og_dtype_name(dt), (long long)K);
    const bool tc = c->dequant_split && bf16_step(x); /* bf16(x) by the weights' hi + lo */
    const uint16_t *xh = x->rs->split_hi;
    if (tc && !(x->hi && x->hi->of == in)) OG_TRY(og_split_bf16_cuda(c->stream, in, T * K, x->rs->split_hi, NULL));
    const float one = 1.0f, zero = 0.0f;
    for (int k = 0; k < n; k++) {
        const og_gemv_cuda_part *pt = &parts[k];
        const float *beta = &zero;
        if (pt->bias) {
            OG_TRY(og_fill_rows_cuda(c->stream, pt->bias, og_bias_dtype(dt), T, pt->N, pt->out));
            beta = &one;
        }
        const int64_t panel = quant_panel_rows(pt->N, K, tc); /* rows dequantized at a time */
        for (int64_t n0 = 0; n0 < pt->N; n0 += panel) {
            const int64_t rows = pt->N - n0 < panel ? pt->N - n0 : panel;
            /* out[T, N] row-major is [N, T] column-major (ld N); the panel's
             * features are its rows n0 .. n0 + rows - 1 */
            cublasStatus_t bs;
            if (tc) {
                uint16_t *wh = c->dequant_split, *wl = c->dequant_split + cm_of(x->m)->max_split;
                OG_TRY(og_dequantize_split_cuda(c->stream, pt->weight, dt, pt->N, K, n0, rows, wh, wl));
                bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)K, &one, wh, CUDA_R_16BF,
                                  (int)K, xh, CUDA_R_16BF, (int)K, beta, pt->out + n0, CUDA_R_32F, (int)pt->N,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                if (bs == CUBLAS_STATUS_SUCCESS && cm_of(x->m)->quant_products != QUANT_HI)
                    bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)K, &one, wl,
                                      CUDA_R_16BF, (int)K, xh, CUDA_R_16BF, (int)K, &one, pt->out + n0, CUDA_R_32F,
                                      (int)pt->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "cublasGemmEx (dequantized weights, bf16 hi + lo)");
                continue;
            }
            if (kq) OG_TRY(og_kquant_dequantize_cuda(c->stream, pt->weight, dt, pt->N, K, n0, rows, c->dequant));
            else OG_TRY(og_dequantize_cuda(c->stream, pt->weight, dt, pt->N, K, n0, rows, c->dequant));
            bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)T, (int)K, &one, c->dequant, (int)K, in,
                             (int)K, beta, pt->out + n0, (int)pt->N);
            if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "cublasSgemm (dequantized weights)");
        }
    }
    return OG_OK;
}

/* Where a kernel writing a value of [T, width] may also write its bf16
 * rounding for the product that reads it (NULL: not wanted): a step whose
 * products take one bf16 product past the gemv's rows, a width within the
 * split scratch. */
static uint16_t *hi_target(const step_run *x, int64_t T, int64_t width) {
    if (!x->hi || T <= gemv_rows(x) || !bf16_step(x) || width > cm_of(x->m)->max_k) return NULL;
    return x->rs->split_hi;
}

/* Products of one input x [T, K] by up to OG_GEMV_CUDA_MAX_PARTS weights of
 * one dtype (the q, k, v projections, or gate and up): up to gemv_rows rows
 * stream the weights once in a gemv; where og_gemm_narrow_cuda_wanted says
 * (by default the q, k, v of grouped-query attention), wider steps of
 * several parts of bf16 weights and x rounded to bf16 (bf16_step) up to
 * OG_GEMM_NARROW_CUDA_MAX_T rows take og_gemm_narrow_cuda, every part in one
 * launch (1.6 - 2.5x cuBLAS's three launches for the q, k, v of an 8B model
 * at 16 - 64 rows; one wide product, cuBLAS is as fast or faster: see
 * bench/gpu/notes.md); the rest go to cuBLAS, f32 weights by SGEMM, bf16 weights by one tensor-core product
 * of x rounded to bf16 or two of x split once into bf16 hi + lo parts; k-quant
 * weights at every width, and q8/q4 past the gemv, as quant_products says. */
static og_status products(const step_run *x, const float *in, og_dtype dt, int64_t T, int64_t K,
                          const og_gemv_cuda_part *parts, int n) {
    og_step_ctx *c = x->c;
    if (og_dtype_is_kquant(dt) && T <= gemv_rows(x)) return quant_products(x, in, dt, T, K, parts, n);
    if (T <= gemv_rows(x)) return og_gemv_multi_cuda(c->stream, in, dt, T, K, parts, n);
    for (int k = 0; k < n; k++)
        if (T > INT32_MAX || K > INT32_MAX || parts[k].N > INT32_MAX || K > cm_of(x->m)->max_k)
            return og_set_error(OG_ERR_UNSUPPORTED, "matmul: %lld x %lld x %lld exceeds the cuBLAS path",
                                (long long)T, (long long)K, (long long)parts[k].N);
    if (og_dtype_is_quantized(dt)) return quant_products(x, in, dt, T, K, parts, n);
    uint16_t *hi = x->rs->split_hi, *lo = x->rs->split_lo;
    const bool bf16 = bf16_step(x);
    const bool made = bf16 && x->hi && x->hi->of == in; /* its producer wrote hi */
    if (dt != OG_DTYPE_F32 && !made) OG_TRY(og_split_bf16_cuda(c->stream, in, T * K, hi, bf16 ? NULL : lo));
    if (bf16 && dt == OG_DTYPE_BF16 && og_gemm_narrow_cuda_wanted(dt, parts, n) &&
        og_gemm_narrow_cuda_takes(hi, dt, T, K, parts, n))
        return og_gemm_narrow_cuda(c->stream, hi, dt, T, K, parts, n);
    const float one = 1.0f, zero = 0.0f;
    for (int k = 0; k < n; k++) {
        const og_gemv_cuda_part *pt = &parts[k];
        const int N = (int)pt->N;
        const float *beta = &zero;
        if (pt->bias) {
            OG_TRY(og_fill_rows_cuda(c->stream, pt->bias, dt, T, pt->N, pt->out));
            beta = &one;
        }
        cublasStatus_t bs;
        if (dt == OG_DTYPE_F32) {
            bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, (int)T, (int)K, &one, pt->weight, (int)K, in,
                             (int)K, beta, pt->out, N);
            if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "cublasSgemm");
            continue;
        }
        /* out[T, N] row-major is out^T [N, T] column-major = W^T-as-stored . x^T */
        bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, (int)T, (int)K, &one, pt->weight, CUDA_R_16BF,
                          (int)K, hi, CUDA_R_16BF, (int)K, beta, pt->out, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
        if (bs == CUBLAS_STATUS_SUCCESS && !bf16)
            bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, (int)T, (int)K, &one, pt->weight, CUDA_R_16BF,
                              (int)K, lo, CUDA_R_16BF, (int)K, &one, pt->out, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(bs, "cublasGemmEx bf16");
    }
    return OG_OK;
}

static og_status matmul(const step_run *x, const float *in, const void *w, const void *bias, og_dtype dt,
                        int64_t T, int64_t K, int64_t N, float *out) {
    const og_gemv_cuda_part part = {w, bias, N, out};
    return products(x, in, dt, T, K, &part, 1);
}

/* The device operands of instruction i, its output, and the rows it runs
 * on (returned). */
typedef struct instr_io {
    const void *v[OG_OP_MAX_INPUTS];
    int64_t w[OG_OP_MAX_INPUTS];
    og_dtype dt[OG_OP_MAX_INPUTS];
    float *out;
} instr_io;

static int64_t instr_operands(const step_run *x, int32_t i, instr_io *io) {
    const og_model *m = x->m;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    memset(io, 0, sizeof *io);
    for (int32_t j = 0; j < in->n_in; j++) io->v[j] = operand_dev(x, in->in[j], &io->w[j], &io->dt[j]);
    const int32_t slot = cm_of(m)->slot_of[i];
    io->out = i == m->logits_instr ? x->rs->logits : slot >= 0 ? x->rs->slots[slot] : NULL; /* NULL: never written */
    return x->rows;
}

/* update_and_attend of every session of the step over its own storage: the
 * one-token sessions (rows 0 .. n_single-1, or a graph's B padded rows) in one
 * launch that reads their storage, lengths and rings from the step block's
 * table; each wider step on its own, and so does a one-token session whose
 * KV dtype is not the one the context's table kernels serve (a graph's
 * sessions all have that dtype: graph_bucket). */
static og_status attend(const step_run *x, const og_program_instr *in, const instr_io *io) {
    const og_model *m = x->m;
    const og_step_plan *p = x->plan;
    const og_kv_config *kv = og_program_kv_config(m->prog);
    const og_kv_layer_config *l = &kv->layers[in->kv_index];
    const int64_t qw = in->out_width, kw = io->w[1];
    const int32_t entries = x->B > 0 ? x->B : p->n_single;
    if (entries > 0) {
        og_attend_batch_cuda_args ba = {
            .q = io->v[0], .k = io->v[1], .v = io->v[2], .out = io->out, .B = entries,
            .n_heads = (int32_t)in->attrs.n_heads, .n_kv_heads = l->n_kv_heads, .head_dim = l->head_dim,
            .kv_dtype = x->c->kv_dtype, .policy = l->policy, .scale = (float)in->attrs.scale,
            .seqs = table_dev(x->rs, in->kv_index),
            .max_keys = l->policy == OG_KV_RING ? l->window : kv->max_capacity, .partials = x->rs->attn_partials,
        };
        OG_TRY(og_update_and_attend_batch_cuda(x->c->stream, &ba));
    }
    for (int32_t i = 0; i < p->n_seqs; i++) { /* wider steps, and one-token ones the table left out */
        const og_step_seq *s = &p->seqs[i];
        if (i < p->n_single && (x->B > 0 || s->s->cfg.kv_dtype == x->c->kv_dtype)) continue;
        og_attend_cuda_args aa = {
            .q = (const float *)io->v[0] + s->row0 * qw, .k = (const float *)io->v[1] + s->row0 * kw,
            .v = (const float *)io->v[2] + s->row0 * kw, .out = io->out + s->row0 * qw, .T = s->T,
            .n_heads = (int32_t)in->attrs.n_heads, .scale = (float)in->attrs.scale, .partials = x->c->partials,
        };
        OG_TRY(og_kv_session_layer_view(s->s->kv, in->kv_index, &aa.kv));
        /* one wide session (hi_target: bf16_step) on the tiled kernel: out as bf16 too, for the o product */
        uint16_t *hi = hi_target(x, x->rows, qw);
        if (hi && p->n_seqs == 1 && og_attend_cuda_tiled(s->T, aa.kv.dtype, aa.kv.head_dim))
            aa.out_bf16 = hi + s->row0 * qw;
        OG_TRY(og_update_and_attend_cuda(x->c->stream, &aa));
        if (aa.out_bf16) x->hi->next = io->out;
    }
    return OG_OK;
}

/* causal_conv1d and gated_delta_net of every session of the step over its
 * own state (the committed copy read, or none at length 0; the other
 * written): the one-token sessions (a graph's B padded rows) in one launch
 * over the step block's state table, each wider step in a launch of its own. */
static og_status state_sessions(const step_run *x, const og_program_instr *in, const instr_io *io) {
    const og_model *m = x->m;
    const og_step_plan *p = x->plan;
    const int32_t k = in->op == OG_OP_CAUSAL_CONV1D ? 2 : 5; /* the state operand */
    const og_program_tensor *st = og_program_tensor_at(m->prog, in->in[k].index);
    const og_op_attrs *at = &in->attrs;
    /* the one-token sessions (a graph's B padded rows) in one launch over the step block's table */
    const int32_t entries = x->B > 0 ? x->B : p->n_single;
    if (entries > 0 && in->op == OG_OP_CAUSAL_CONV1D) {
        OG_TRY(og_causal_conv1d_batch_cuda(x->c->stream, io->v[0], io->v[1], io->dt[1],
                                           states_dev(x->rs, st->state_index), entries, io->w[0],
                                           og_program_tensor_at(m->prog, in->in[1].index)->shape[1], io->out));
    } else if (entries > 0) {
        const og_gdn_args ga = {
            .qkv = io->v[0], .a = io->v[1], .b = io->v[2], .A_log = io->v[3], .dt_bias = io->v[4],
            .A_log_dtype = io->dt[3], .dt_bias_dtype = io->dt[4], .T = 1, .Hk = at->k_heads, .Hv = at->v_heads,
            .Dk = at->k_head_dim, .Dv = at->v_head_dim, .out = io->out,
        };
        OG_TRY(og_gated_delta_net_batch_cuda(x->c->stream, &ga, states_dev(x->rs, st->state_index), entries));
    }
    for (int32_t i = p->n_single; i < p->n_seqs; i++) { /* wider steps, one launch each */
        const og_step_seq *q = &p->seqs[i];
        og_kv_state_view v;
        OG_TRY(og_kv_session_state_view(q->s->kv, st->state_index, &v));
        const float *read = q->L > 0 ? v.read : NULL;
        if (in->op == OG_OP_CAUSAL_CONV1D) {
            const int64_t C = io->w[0], K = og_program_tensor_at(m->prog, in->in[1].index)->shape[1];
            OG_TRY(og_causal_conv1d_cuda(x->c->stream, (const float *)io->v[0] + q->row0 * C, io->v[1], io->dt[1], read,
                                         v.write, q->T, C, K, io->out + q->row0 * C));
            continue;
        }
        const og_op_attrs *a = &in->attrs;
        const int64_t W = io->w[0], Hv = a->v_heads;
        const og_gdn_args ga = {
            .qkv = (const float *)io->v[0] + q->row0 * W, .a = (const float *)io->v[1] + q->row0 * Hv,
            .b = (const float *)io->v[2] + q->row0 * Hv, .A_log = io->v[3], .dt_bias = io->v[4],
            .A_log_dtype = io->dt[3], .dt_bias_dtype = io->dt[4], .T = q->T, .Hk = a->k_heads, .Hv = Hv,
            .Dk = a->k_head_dim, .Dv = a->v_head_dim, .state_in = read, .state_out = v.write,
            .out = io->out + q->row0 * Hv * a->v_head_dim,
        };
        OG_TRY(og_gated_delta_net_cuda(x->c->stream, &ga));
    }
    return OG_OK;
}

static og_status run_instr(const step_run *x, int32_t i) {
    const og_model *m = x->m;
    og_step_ctx *c = x->c;
    const og_program_instr *in = og_program_instr_at(m->prog, i);
    instr_io io;
    const int64_t T = instr_operands(x, i, &io);
    const void *const *v = io.v;
    const int64_t *w = io.w;
    const og_dtype *dt = io.dt;
    float *out = io.out;
    const og_op_attrs *a = &in->attrs;
    switch (in->op) {
    case OG_OP_EMBED: {
        const og_program_tensor *t = og_program_tensor_at(m->prog, in->in[1].index);
        if (og_dtype_is_kquant(dt[1]))
            return og_kquant_embed_cuda(c->stream, v[0], T, v[1], dt[1], t->shape[0], t->shape[1], out);
        return og_embed_cuda(c->stream, v[0], T, v[1], dt[1], t->shape[0], t->shape[1], out);
    }
    case OG_OP_RMS_NORM:
        return og_rms_norm_cuda(c->stream, v[0], v[1], dt[1], T, w[0], (float)a->eps, out);
    case OG_OP_HEAD_RMS_NORM:
        return og_head_rms_norm_cuda(c->stream, v[0], v[1], dt[1], T, a->heads, w[0] / a->heads, (float)a->eps, out);
    case OG_OP_MATMUL:
        return matmul(x, v[0], v[1], in->n_in > 2 ? v[2] : NULL, dt[1], T, w[0], in->out_width, out);
    case OG_OP_ROPE:
        return og_rope_cuda(c->stream, cm_of(m)->inv_freq + (size_t)i * (OG_ROPE_MAX_HEAD_DIM / 2),
                            m->rope[i].head_dim, v[0], v[1], T, a->heads, out);
    case OG_OP_SWIGLU: {
        uint16_t *hi = hi_target(x, T, w[0]);
        OG_TRY(og_swiglu_cuda(c->stream, v[0], v[1], T * w[0], out, hi));
        if (hi) x->hi->next = out;
        return OG_OK;
    }
    case OG_OP_ADD:
        return og_add_cuda(c->stream, v[0], v[1], T * w[0], out);
    case OG_OP_UPDATE_AND_ATTEND:
        return attend(x, in, &io);
    case OG_OP_CAUSAL_CONV1D:
    case OG_OP_GATED_DELTA_NET:
        return state_sessions(x, in, &io);
    case OG_OP_RMS_NORM_GATED:
        return og_rms_norm_gated_cuda(c->stream, v[0], v[1], v[2], dt[2], T, a->heads, w[0] / a->heads, (float)a->eps,
                                      out);
    case OG_OP_SIGMOID_MUL:
        return og_sigmoid_mul_cuda(c->stream, v[0], v[1], T * w[0], out);
    case OG_OP_MOE: {
        const og_program_tensor *gu = og_program_tensor_at(m->prog, in->in[2].index);
        const og_moe_cuda_args ma = {.x = v[0], .logits = v[1], .gate_up = v[2], .gate_up_dtype = dt[2],
                                     .down = v[3], .down_dtype = dt[3], .shared = in->n_in > 4 ? v[4] : NULL,
                                     .shared_gate = in->n_in > 5 ? v[5] : NULL, .T = T, .H = w[0],
                                     .F = gu->shape[1] / 2, .E = gu->shape[0], .top_k = (int32_t)a->top_k,
                                     .norm_topk_prob = a->norm_topk_prob != 0, .out = out};
        return T > 0 ? og_moe_cuda(c->stream, &ma, x->rs->moe_scratch) : OG_OK;
    }
    case OG_OP_COUNT:
        break;
    }
    return og_set_error(OG_ERR_UNSUPPORTED, "op %d has no CUDA kernel", (int)in->op);
}

/* Runs instructions one by one; *failed names the one whose launch failed. */
static og_status run_each(const step_run *x, const int32_t *instrs, int32_t n, int32_t *failed) {
    for (int32_t k = 0; k < n; k++) {
        *failed = instrs[k];
        OG_TRY(run_instr(x, instrs[k]));
    }
    return OG_OK;
}

/* The add + rms_norm prologue of step sp as a gemv's norm input, when the
 * step's rows take the gemv path and fit its shared memory. */
static bool norm_prologue(const step_run *x, const og_fuse_step *sp, og_gemv_cuda_norm *nm) {
    if (!sp->n_pre) return false;
    instr_io a, b, p;
    const int64_t T = instr_operands(x, sp->instr[0], &a);
    instr_operands(x, sp->instr[sp->n_pre], &p); /* the first product: its weights' dtype */
    if (T > gemv_rows(x)) return false;
    if (og_dtype_is_kquant(p.dt[1])) { /* the streamed k-quant gemv, where it stages x */
        const int products = sp->kind == OG_FUSE_GATE_UP ? 2 : sp->n - sp->n_pre;
        if (!og_kquant_gemv_cuda_norm_takes(p.dt[1], T, a.w[0], products)) return false;
    } else if (!og_gemv_cuda_norm_fits(p.dt[1], T, a.w[0])) {
        return false;
    }
    instr_operands(x, sp->instr[1], &b);
    const og_program_instr *norm = og_program_instr_at(x->m->prog, sp->instr[1]);
    *nm = (og_gemv_cuda_norm){a.v[0], a.v[1], b.v[1], b.dt[1], (float)norm->attrs.eps, a.out};
    return true;
}

/* add (instruction add_i) and the rms_norm of its sum (norm_i) in one
 * launch, with the bf16 copy of the normed rows where a product takes it:
 * for this launch step's products (a prologue) or the next step's. */
static og_status add_norm(const step_run *x, int32_t add_i, int32_t norm_i, bool prologue) {
    instr_io a, b;
    const int64_t T = instr_operands(x, add_i, &a);
    instr_operands(x, norm_i, &b);
    const og_program_instr *nrm = og_program_instr_at(x->m->prog, norm_i);
    uint16_t *hi = hi_target(x, T, a.w[0]);
    OG_TRY(og_add_rms_norm_cuda(x->c->stream, a.v[0], a.v[1], b.v[1], b.dt[1], T, a.w[0], (float)nrm->attrs.eps,
                                a.out, b.out, hi));
    if (hi) *(prologue ? &x->hi->of : &x->hi->next) = b.out;
    return OG_OK;
}

/* One launch step: a fused kernel, or its instructions one by one where the
 * step is wider than the fused kernel serves. *failed names the instruction
 * whose launch failed. */
static og_status run_fused(const step_run *x, const og_fuse_step *sp, int32_t *failed) {
    const og_model *m = x->m;
    og_step_ctx *c = x->c;
    og_gemv_cuda_norm norm;
    const og_gemv_cuda_norm *pro = norm_prologue(x, sp, &norm) ? &norm : NULL;
    if (sp->n_pre && !pro) { /* the prologue on its own: the products then read its output */
        *failed = sp->instr[0];
        OG_TRY(add_norm(x, sp->instr[0], sp->instr[1], true));
    }
    const int32_t *mi = sp->instr + sp->n_pre, n = sp->n - sp->n_pre;
    const int32_t i = mi[0];
    instr_io a, b;
    *failed = i;
    switch (sp->kind) {
    case OG_FUSE_ADD_NORM:
        return add_norm(x, i, mi[1], false);
    case OG_FUSE_NORM_ROPE: { /* pairs (head norm, rope) */
        og_head_norm_rope_cuda_job jobs[2];
        int64_t T = 0;
        for (int32_t k = 0; k < n / 2; k++) {
            const int32_t norm_i = mi[2 * k], rope_i = mi[2 * k + 1];
            T = instr_operands(x, norm_i, &a);
            instr_operands(x, rope_i, &b);
            const og_program_instr *nrm = og_program_instr_at(m->prog, norm_i);
            const int64_t heads = nrm->attrs.heads;
            jobs[k] = (og_head_norm_rope_cuda_job){a.v[0], a.v[1], a.dt[1],
                                                   cm_of(m)->inv_freq + (size_t)rope_i * (OG_ROPE_MAX_HEAD_DIM / 2),
                                                   heads, a.w[0] / heads, (float)nrm->attrs.eps, b.out};
        }
        return og_head_norm_rope_multi_cuda(c->stream, jobs, n / 2, b.v[1], T);
    }
    case OG_FUSE_GATE_UP: {
        const int64_t T = instr_operands(x, i, &a);
        instr_operands(x, mi[1], &b);
        instr_io sw;
        instr_operands(x, mi[2], &sw);
        const og_program_instr *g = og_program_instr_at(m->prog, i);
        /* k-quants up to the gemv's rows, where the streamed gemv takes both
           products: the swiglu in the same launch (gate and up not written) */
        if (og_dtype_is_kquant(a.dt[1]) && T <= gemv_rows(x) && x->rs->kq_x && a.w[0] <= cm_of(m)->kq_max_k &&
            og_kquant_gemv_cuda_swiglu_takes(a.dt[1], T, a.w[0])) {
            const og_gemv_cuda_part parts[2] = {{a.v[1], g->n_in > 2 ? a.v[2] : NULL, g->out_width, a.out},
                                                {b.v[1], g->n_in > 2 ? b.v[2] : NULL, g->out_width, b.out}};
            return og_kquant_gemv_x_swiglu_cuda(c->stream, pro ? NULL : a.v[0], pro, x->rs->kq_x, a.dt[1], T, a.w[0],
                                                parts, sw.out);
        }
        /* one split of x for both products; k-quants: x's terms written once
           (with a prologue, from the norm: only k-quant steps take one here) */
        if ((T > gemv_rows(x) || og_dtype_is_kquant(a.dt[1])) && a.out && b.out) {
            const og_gemv_cuda_part parts[2] = {{a.v[1], g->n_in > 2 ? a.v[2] : NULL, g->out_width, a.out},
                                                {b.v[1], g->n_in > 2 ? b.v[2] : NULL, g->out_width, b.out}};
            if (pro) OG_TRY(og_kquant_gemv_x_multi_cuda(c->stream, NULL, pro, x->rs->kq_x, a.dt[1], T, a.w[0], parts, 2));
            else OG_TRY(products(x, a.v[0], a.dt[1], T, a.w[0], parts, 2));
            *failed = mi[2];
            uint16_t *hi = hi_target(x, T, g->out_width);
            OG_TRY(og_swiglu_cuda(c->stream, a.out, b.out, T * g->out_width, sw.out, hi));
            if (hi) x->hi->next = sw.out;
            return OG_OK;
        }
        if (og_dtype_is_kquant(a.dt[1]) && pro) { /* no gate / up outputs to write: the prologue on its own */
            *failed = sp->instr[0];
            OG_TRY(add_norm(x, sp->instr[0], sp->instr[1], true));
        }
        if (T > gemv_rows(x) || og_dtype_is_kquant(a.dt[1])) break;
        return og_gemv_norm_swiglu_cuda(c->stream, pro ? NULL : a.v[0], pro, a.v[1], g->n_in > 2 ? a.v[2] : NULL,
                                        b.v[1], g->n_in > 2 ? b.v[2] : NULL, a.dt[1], T, a.w[0], g->out_width, sw.out);
    }
    case OG_FUSE_PRODUCTS:
    case OG_FUSE_ONE: {
        const int64_t T = instr_operands(x, i, &a);
        /* one split of x for every product; k-quants: x's terms written once
           (with a prologue, from the norm: only k-quant steps take one here) */
        if ((T > gemv_rows(x) || og_dtype_is_kquant(a.dt[1])) && (sp->kind == OG_FUSE_PRODUCTS || pro)) {
            og_gemv_cuda_part parts[OG_GEMV_CUDA_MAX_PARTS];
            for (int32_t k = 0; k < n; k++) {
                const og_program_instr *in = og_program_instr_at(m->prog, mi[k]);
                instr_operands(x, mi[k], &b);
                parts[k] = (og_gemv_cuda_part){b.v[1], in->n_in > 2 ? b.v[2] : NULL, in->out_width, b.out};
            }
            if (pro) return og_kquant_gemv_x_multi_cuda(c->stream, NULL, pro, x->rs->kq_x, a.dt[1], T, a.w[0], parts, n);
            return products(x, a.v[0], a.dt[1], T, a.w[0], parts, n);
        }
        if (T > gemv_rows(x) || og_dtype_is_kquant(a.dt[1]) || (sp->kind == OG_FUSE_ONE && !pro)) break;
        og_gemv_cuda_part parts[OG_GEMV_CUDA_MAX_PARTS];
        for (int32_t k = 0; k < n; k++) {
            const og_program_instr *in = og_program_instr_at(m->prog, mi[k]);
            instr_operands(x, mi[k], &b);
            parts[k] = (og_gemv_cuda_part){b.v[1], in->n_in > 2 ? b.v[2] : NULL, in->out_width, b.out};
        }
        return og_gemv_norm_multi_cuda(c->stream, pro ? NULL : a.v[0], pro, a.dt[1], T, a.w[0], parts, n);
    }
    default:
        break;
    }
    return run_each(x, mi, n, failed);
}

/* Charges the device work enqueued since the last mark to label, under
 * OG_CUDA_PROFILE (profile_cuda.h). */
static og_status profile_mark(const step_run *x, const char *label, uint64_t bytes) {
    /* a graph's compute is enqueued only while it is captured */
    return x->marks ? og_cuda_marks_add(x->marks, x->c->stream, label, bytes, x->B > 0) : OG_OK;
}

/* The profile's label of launch step sp in buf (its ops, with each
 * product's K -> N and the weights' dtype); returns the weight bytes its
 * products read. */
static uint64_t step_label(const og_model *m, const og_fuse_step *sp, char *buf, size_t n) {
    uint64_t bytes = 0;
    size_t len = 0;
    const char *dtype = NULL;
    bool product = false;
    buf[0] = 0;
    for (int32_t k = 0; k < sp->n && len < n; k++) {
        const og_program_instr *in = og_program_instr_at(m->prog, sp->instr[k]);
        const og_program_tensor *w = in->op == OG_OP_MATMUL && in->in[1].kind == OG_VALUE_TENSOR
                                         ? og_program_tensor_at(m->prog, in->in[1].index)
                                         : NULL;
        const char *sep = k ? "+" : "";
        if (w && product) {
            len += (size_t)snprintf(buf + len, n - len, "+%lld", (long long)in->out_width);
        } else if (w) {
            len += (size_t)snprintf(buf + len, n - len, "%smatmul %lld->%lld", sep, (long long)w->shape[1],
                                    (long long)in->out_width);
        } else {
            len += (size_t)snprintf(buf + len, n - len, "%s%s", sep, og_op_get(in->op)->name);
        }
        if (w) {
            product = true;
            bytes += w->nbytes;
            dtype = og_dtype_name(w->dtype);
        }
    }
    if (dtype && len < n) snprintf(buf + len, n - len, " %s", dtype);
    return bytes;
}

/* Moves the tail's rows of every value the tail reads to the front (rows
 * only move down, in increasing order, on one stream: safe in place). */
static og_status compact_for_tail(const step_run *x) {
    const og_model *m = x->m;
    const og_step_plan *p = x->plan;
    for (int32_t i = 0; i <= m->last_attend; i++) {
        const int32_t slot = cm_of(m)->slot_of[i];
        if (slot < 0) continue;
        const og_program_instr *in = og_program_instr_at(m->prog, i);
        bool read = false; /* by a tail instruction */
        for (int32_t t = m->last_attend + 1; t < m->n_instrs && !read; t++) {
            const og_program_instr *ti = og_program_instr_at(m->prog, t);
            for (int32_t j = 0; j < ti->n_in; j++)
                if (ti->in[j].kind == OG_VALUE_ACTIVATION && ti->in[j].index == i) read = true;
        }
        if (!read) continue;
        float *base = x->rs->slots[slot];
        const size_t row = (size_t)in->out_width * sizeof(float);
        for (int32_t j = 0; j < p->n_tail_rows; j++)
            if (p->tail_src[j] != j)
                CUDA_TRY(cudaMemcpyAsync(base + (size_t)j * (size_t)in->out_width,
                                         base + (size_t)p->tail_src[j] * (size_t)in->out_width, row,
                                         cudaMemcpyDeviceToDevice, x->c->stream),
                         "tail rows");
    }
    return OG_OK;
}

/* The row of the tail (of the logits, the sampler's rows and tokens) that
 * holds session q's output: a graph's tail runs on all B rows. */
static int32_t out_row(const step_run *x, const og_step_seq *q) { return x->B > 0 ? q->row0 : q->tail_row0; }

/* Enqueues every launch step in order (the tail on out_rows rows), with
 * x->hi set. */
static og_status launch_steps(step_run *x, int64_t out_rows, int32_t *failed) {
    og_model *m = x->m;
    const og_step_plan *p = x->plan;
    for (int32_t k = 0; k < m->n_steps; k++) {
        const og_fuse_step *sp = &m->steps[k];
        const bool tail = og_exec_in_tail(m, sp->instr[0]);
        /* the previous step's bf16 copy serves this step's products, unless a prologue runs first */
        x->hi->of = sp->n_pre ? NULL : x->hi->next;
        x->hi->next = NULL;
        if (tail && out_rows == 0) continue; /* no output is asked for */
        if (tail && !x->tail) {
            if (x->B == 0 && !p->tail_is_all) OG_TRY(compact_for_tail(x));
            OG_TRY(profile_mark(x, "tail rows", 0));
            x->hi->of = NULL; /* rows moved */
            x->tail = true;
            x->rows = out_rows;
        }
        OG_TRY(run_fused(x, sp, failed));
        *failed = -1;
        if (x->marks) {
            char label[128];
            const uint64_t bytes = step_label(m, sp, label, sizeof label);
            OG_TRY(profile_mark(x, label, bytes));
        }
        for (int32_t j = 0; cm_of(m)->nccl && j < sp->n; j++) { /* the all-reduces after row-parallel products */
            const int32_t i = sp->instr[j], slot = cm_of(m)->slot_of[i];
            if (!cm_of(m)->all_reduce[i]) continue;
            *failed = i;
            if (slot < 0) return og_set_error(OG_ERR_UNSUPPORTED, "a reduced output its fused step does not write");
            OG_TRY(og_nccl_all_reduce_sum(cm_of(m)->nccl, 0, x->rs->slots[slot],
                                          (size_t)(x->rows * og_program_instr_at(m->prog, i)->out_width), x->c->stream));
            *failed = -1;
            OG_TRY(profile_mark(x, "all_reduce", 0));
        }
    }
    return OG_OK;
}

/* Enqueues the step's device work: every launch step (the tail on its rows;
 * a graph's tail on all B rows), then the sampler over the tail rows. The
 * block upload and the copies back are not part of it, so that a graph
 * captures exactly this. */
static og_status enqueue_compute(step_run *x, int32_t *failed) {
    og_model *m = x->m;
    const og_step_plan *p = x->plan;
    *failed = -1;
    const int64_t out_rows = x->B > 0 ? x->B : p->n_tail_rows;
    OG_TRY(profile_mark(x, "step block upload", 0));
    hi_copy hi = {NULL, NULL};
    x->hi = &hi;
    const og_status st = launch_steps(x, out_rows, failed);
    x->hi = NULL;
    OG_TRY(st);
    /* the masks first: the sampler, the logits copied back and the rows
     * sampled on the host see only the allowed tokens */
    if (x->B > 0 || x->c->n_masks > 0) {
        OG_TRY(og_mask_logits_cuda(x->c->stream, x->rs->logits, m->vocab, (int32_t)out_rows,
                                   (const int32_t *)(const void *)(x->rs->block_dev + x->rs->layout.mask_of),
                                   x->rs->masks_dev));
        OG_TRY(profile_mark(x, "mask", 0));
    }
    if (x->B > 0 || x->c->device_tokens) {
        OG_TRY(og_sample_batch_cuda(x->c->stream, x->rs->logits, m->vocab, (int32_t)out_rows,
                                    (const og_sample_cuda_row *)(const void *)(x->rs->block_dev + x->rs->layout.samplers),
                                    x->rs->next_dev));
        OG_TRY(profile_mark(x, "sample", 0));
    }
    return OG_OK;
}

/* The forbidden-token bitmap of a session's sampler on the device, uploaded
 * when it changed. */
static og_status forbidden_dev(og_model *m, og_step_ctx *c, og_session *s, const og_sampler *sampler,
                               const uint32_t **out) {
    cuda_session *cs = s->be;
    const uint32_t *forbidden = og_sampler_forbidden(sampler);
    *out = NULL;
    if (!forbidden) return OG_OK;
    const size_t bytes = og_sample_cuda_marks_bytes(m->vocab);
    if (!cs->forbidden_dev) CUDA_TRY(cudaMalloc((void **)&cs->forbidden_dev, bytes), "forbidden tokens");
    if (!cs->forbidden_seen && !(cs->forbidden_seen = og_malloc(bytes)))
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "no memory for the forbidden tokens");
    if (!cs->forbidden_valid || memcmp(forbidden, cs->forbidden_seen, bytes)) {
        memcpy(cs->forbidden_seen, forbidden, bytes);
        cs->forbidden_valid = false;
        /* from pageable memory: the copy has read forbidden_seen when this returns */
        CUDA_TRY(cudaMemcpyAsync(cs->forbidden_dev, cs->forbidden_seen, bytes, cudaMemcpyHostToDevice, c->stream),
                 "forbidden tokens upload");
        cs->forbidden_valid = true;
    }
    *out = cs->forbidden_dev;
    return OG_OK;
}

/* Whether the device draws the token of a SAMPLE row of this sampler: what
 * og_sample_cuda_supported accepts, with no step of the chain that only the
 * host's og_sampler_sample applies (logit bias, presence and frequency
 * penalties); otherwise the row's logits come back and the host draws. */
static bool device_draws(const og_sampler *s, int64_t V) {
    const og_sampler_params *sp = og_sampler_get_params(s);
    return og_sample_cuda_supported(sp->temperature, sp->top_k, V) && !og_sampler_host_only(s);
}

/* Writes the step block: the rows' tokens and positions (and the tail's),
 * every attention layer's and every state's table of one-token sessions (B
 * entries, padding past the sessions), the samplers' rows and their recent
 * tokens. Counts the rows sampled on the host (their sampler asks for more
 * than the device sampler keeps) in *n_host. */
static og_status fill_block(step_run *x, int32_t *n_host) {
    og_model *m = x->m;
    og_step_ctx *c = x->c;
    row_set *r = x->rs;
    const og_step_plan *p = x->plan;
    int32_t *blk = (int32_t *)(void *)r->block_host;
    int32_t *tok = block_array(blk, r->cap, BLOCK_TOKENS), *pos = block_array(blk, r->cap, BLOCK_POSITIONS);
    int32_t *ttok = block_array(blk, r->cap, BLOCK_TAIL_TOKENS), *tpos = block_array(blk, r->cap, BLOCK_TAIL_POSITIONS);
    const int32_t rows = x->B > 0 ? x->B : p->n_rows, out_rows = x->B > 0 ? x->B : p->n_tail_rows;
    memcpy(tok, p->tokens, (size_t)p->n_rows * sizeof *tok);
    memcpy(pos, p->positions, (size_t)p->n_rows * sizeof *pos);
    for (int32_t j = p->n_rows; j < rows; j++) tok[j] = pos[j] = 0; /* a graph's padding */
    for (int32_t j = 0; j < p->n_tail_rows; j++) {
        ttok[j] = p->tokens[p->tail_src[j]];
        tpos[j] = p->positions[p->tail_src[j]];
    }
    const og_kv_config *kv = og_program_kv_config(m->prog);
    og_state_cuda_seq *stab = (og_state_cuda_seq *)(void *)(r->block_host + r->layout.states);
    for (int32_t sidx = 0; sidx < kv->n_states; sidx++) { /* the states of the one-token sessions */
        og_state_cuda_seq *t = stab + (size_t)sidx * (size_t)r->cap;
        const int32_t n = x->B > 0 ? x->B : p->n_single;
        for (int32_t i = 0; i < n; i++) {
            if (i >= p->n_single) {
                t[i] = (og_state_cuda_seq){0}; /* a graph's padding: skipped */
                continue;
            }
            og_kv_state_view v;
            OG_TRY(og_kv_session_state_view(p->seqs[i].s->kv, sidx, &v));
            t[i] = (og_state_cuda_seq){.read = p->seqs[i].L > 0 ? v.read : NULL, .write = v.write};
        }
    }
    og_attend_cuda_seq *table = (og_attend_cuda_seq *)(void *)(r->block_host + r->layout.table);
    const int32_t entries = x->B > 0 ? x->B : p->n_single;
    for (int32_t l = 0; l < kv->n_layers; l++) {
        og_attend_cuda_seq *t = table + (size_t)l * (size_t)r->cap;
        for (int32_t i = 0; i < entries; i++) {
            if (i >= p->n_single || p->seqs[i].s->cfg.kv_dtype != c->kv_dtype) {
                t[i] = (og_attend_cuda_seq){0}; /* padding, or a session of another kv dtype (attends alone) */
                continue;
            }
            og_kv_layer_view v;
            OG_TRY(og_kv_session_layer_view(p->seqs[i].s->kv, l, &v));
            t[i] = (og_attend_cuda_seq){.k = v.k, .v = v.v, .row_stride = og_kv_layer_view_row_stride(&v),
                                        .length = v.length, .rows = v.rows, .window = v.window, .T = 1};
        }
    }
    og_sample_cuda_row *srow = (og_sample_cuda_row *)(void *)(r->block_host + r->layout.samplers);
    for (int32_t j = 0; j < out_rows; j++) srow[j] = (og_sample_cuda_row){.mode = OG_SAMPLE_ROW_NONE};
    /* the masks, packed in the order of the rows that have one */
    int32_t *mask_of = (int32_t *)(void *)(r->block_host + r->layout.mask_of);
    for (int32_t j = 0; j < out_rows; j++) mask_of[j] = 0;
    int32_t n_masks = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) n_masks += p->seqs[i].item->allowed != NULL;
    OG_TRY(reserve_masks(m, r, n_masks));
    const size_t mask_bytes = og_sample_cuda_marks_bytes(m->vocab);
    c->n_masks = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const og_step_seq *q = &p->seqs[i];
        if (!q->item->allowed) continue;
        memcpy((unsigned char *)r->masks_host + (size_t)c->n_masks * mask_bytes, q->item->allowed, mask_bytes);
        mask_of[out_row(x, q)] = ++c->n_masks;
    }
    int64_t recent = 0;
    c->device_tokens = false;
    *n_host = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const og_step_seq *q = &p->seqs[i];
        const og_batch_item *it = q->item;
        if (it->output == OG_OUTPUT_ARGMAX) {
            srow[out_row(x, q)].mode = OG_SAMPLE_ROW_ARGMAX;
            c->device_tokens = true;
        }
        if (it->output != OG_OUTPUT_SAMPLE) continue;
        const og_sampler_params *sp = og_sampler_get_params(it->sampler);
        if (!device_draws(it->sampler, m->vocab)) {
            (*n_host)++;
            continue;
        }
        const int32_t *ids;
        const int32_t n_recent = sp->repeat_penalty != 1.0f ? og_sampler_recent(it->sampler, &ids) : 0;
        OG_TRY(reserve_recent(c, recent + n_recent + p->n_seqs)); /* grows before any id is written */
        recent += n_recent;
    }
    recent = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const og_step_seq *q = &p->seqs[i];
        const og_batch_item *it = q->item;
        if (it->output != OG_OUTPUT_SAMPLE) continue;
        const og_sampler_params *sp = og_sampler_get_params(it->sampler);
        if (!device_draws(it->sampler, m->vocab)) continue;
        const int32_t *ids;
        const int32_t n_recent = sp->repeat_penalty != 1.0f ? og_sampler_recent(it->sampler, &ids) : 0;
        if (n_recent > 0) memcpy(c->recent_host + recent, ids, (size_t)n_recent * sizeof(int32_t));
        const uint32_t *forbidden;
        OG_TRY(forbidden_dev(m, c, q->s, it->sampler, &forbidden));
        srow[out_row(x, q)] = (og_sample_cuda_row){
            .mode = OG_SAMPLE_ROW_SAMPLE,
            .step = {.uniform = og_sampler_peek_uniform(it->sampler), .temperature = sp->temperature,
                     .top_p = sp->top_p, .min_p = sp->min_p, .repeat_penalty = sp->repeat_penalty,
                     .top_k = sp->top_k, .n_recent = n_recent, .use_forbidden = forbidden != NULL},
            .recent = n_recent > 0 ? c->recent_dev + recent : NULL,
            .forbidden = forbidden,
            .marks = (uint32_t *)(void *)((unsigned char *)r->marks +
                                          (size_t)out_row(x, q) * og_sample_cuda_marks_bytes(m->vocab)),
        };
        recent += n_recent;
        c->device_tokens = true;
    }
    c->recent_used = recent;
    return OG_OK;
}

/* The bucket of a decode step of n sessions (2^b >= n), or -1 when the step
 * does not replay a graph. */
static int32_t graph_bucket(const og_model *m, const og_step_ctx *c, const og_step_plan *p) {
    if (!m->cuda_graphs || !p->decode_only || p->n_seqs > GRAPH_MAX_ROWS) return -1;
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].s->cfg.kv_dtype != c->kv_dtype) return -1;
    int32_t b = 0;
    while ((1 << b) < p->n_seqs) b++;
    return b;
}

static og_status capture(step_run *x, int32_t bucket, int32_t *failed) {
    og_step_ctx *c = x->c;
    CUDA_TRY(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    og_status st = enqueue_compute(x, failed);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (st != OG_OK) {
        if (g) cudaGraphDestroy(g);
        return st;
    }
    if (e != cudaSuccess) return cuda_fail(e, "cudaStreamEndCapture");
    e = cudaGraphInstantiate(&c->graph[bucket], g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        c->graph[bucket] = NULL;
        return cuda_fail(e, "cudaGraphInstantiate");
    }
    return OG_OK;
}

/* Enqueues the whole step: the block upload, the compute (a graph replay
 * for decode steps), and the copies back. */
static og_status enqueue(step_run *x, int32_t bucket, int32_t n_host, int32_t *failed) {
    og_model *m = x->m;
    og_step_ctx *c = x->c;
    row_set *r = x->rs;
    const og_step_plan *p = x->plan;
    const int64_t V = m->vocab;
    *failed = -1;
    bool captured = false;
    if (bucket >= 0 && !c->graph[bucket]) {
        OG_TRY(capture(x, bucket, failed));
        captured = true;
    }
    /* the parts of the step block this step wrote: the rows' arrays, each
     * layer's first table entries, the first sampler rows */
    const int32_t rows = x->B > 0 ? x->B : p->n_rows, out_rows = x->B > 0 ? x->B : p->n_tail_rows;
    const int32_t entries = x->B > 0 ? x->B : p->n_single;
    const size_t pitch = (size_t)r->cap * sizeof(int32_t);
    CUDA_TRY(cudaMemcpy2DAsync(r->block_dev, pitch, r->block_host, pitch, (size_t)rows * sizeof(int32_t), BLOCK_ARRAYS,
                               cudaMemcpyHostToDevice, c->stream),
             "step block upload");
    const size_t tpitch = (size_t)r->cap * sizeof(og_attend_cuda_seq);
    const int32_t n_layers = og_program_kv_config(m->prog)->n_layers;
    if (entries > 0)
        CUDA_TRY(cudaMemcpy2DAsync(r->block_dev + r->layout.table, tpitch, r->block_host + r->layout.table, tpitch,
                                   (size_t)entries * sizeof(og_attend_cuda_seq), (size_t)n_layers,
                                   cudaMemcpyHostToDevice, c->stream),
                 "attention table upload");
    const int32_t n_states = og_program_kv_config(m->prog)->n_states;
    const size_t spitch = (size_t)r->cap * sizeof(og_state_cuda_seq);
    if (entries > 0 && n_states > 0)
        CUDA_TRY(cudaMemcpy2DAsync(r->block_dev + r->layout.states, spitch, r->block_host + r->layout.states, spitch,
                                   (size_t)entries * sizeof(og_state_cuda_seq), (size_t)n_states,
                                   cudaMemcpyHostToDevice, c->stream),
                 "state table upload");
    if (out_rows > 0)
        CUDA_TRY(cudaMemcpyAsync(r->block_dev + r->layout.samplers, r->block_host + r->layout.samplers,
                                 (size_t)out_rows * sizeof(og_sample_cuda_row), cudaMemcpyHostToDevice, c->stream),
                 "sampler rows upload");
    if (out_rows > 0)
        CUDA_TRY(cudaMemcpyAsync(r->block_dev + r->layout.mask_of, r->block_host + r->layout.mask_of,
                                 (size_t)out_rows * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream),
                 "mask table upload");
    if (c->n_masks > 0)
        CUDA_TRY(cudaMemcpyAsync(r->masks_dev, r->masks_host, (size_t)c->n_masks * og_sample_cuda_marks_bytes(V),
                                 cudaMemcpyHostToDevice, c->stream),
                 "token masks upload");
    if (c->recent_used > 0)
        CUDA_TRY(cudaMemcpyAsync(c->recent_dev, c->recent_host, (size_t)c->recent_used * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, c->stream),
                 "recent tokens upload");
    if (bucket >= 0) {
        CUDA_TRY(cudaGraphLaunch(c->graph[bucket], c->stream), "cudaGraphLaunch");
        og_model_note_graph(m, p, bucket, captured);
    } else {
        step_run eager = *x;
        OG_TRY(enqueue_compute(&eager, failed));
    }
    OG_TRY(reserve_host_rows(m, c, n_host));
    int32_t host = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const og_step_seq *q = &p->seqs[i];
        const float *row = r->logits + (size_t)out_row(x, q) * (size_t)V;
        const og_step_output out = q->item->output;
        const bool on_host = out == OG_OUTPUT_SAMPLE &&
                             !device_draws(q->item->sampler, V);
        if (out == OG_OUTPUT_LOGITS || out == OG_OUTPUT_LOGITS_ALL)
            CUDA_TRY(cudaMemcpyAsync(q->item->logits, row, (size_t)q->tail_rows * (size_t)V * sizeof(float),
                                     cudaMemcpyDeviceToHost, c->stream),
                     "logits copy back");
        if (on_host)
            CUDA_TRY(cudaMemcpyAsync(c->host_rows + (size_t)host++ * (size_t)V, row, (size_t)V * sizeof(float),
                                     cudaMemcpyDeviceToHost, c->stream),
                     "logits copy back");
    }
    if (bucket >= 0 || c->device_tokens)
        CUDA_TRY(cudaMemcpyAsync(r->next_host, r->next_dev, (size_t)out_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                 c->stream),
                 "token copy back");
    if (x->marks && bucket >= 0 && !captured) /* a replay: its marks' last, after the graph's */
        return og_cuda_marks_again(x->marks, c->stream, og_cuda_marks_count(x->marks) - 1);
    return x->marks ? og_cuda_marks_add(x->marks, c->stream, "copies back", 0, false) : OG_OK;
}

/* OG_CUDA_PROFILE: the recording x's step adds to (x->marks), started, or
 * for a graph's replay its first event recorded again. Events are made here,
 * before any capture. */
static og_status profile_start(step_run *x, int32_t bucket) {
    og_step_ctx *c = x->c;
    og_cuda_marks **mk = &c->marks[bucket >= 0 ? 1 + bucket : 0];
    OG_TRY(og_cuda_marks_reserve(mk, x->m->n_steps + x->m->n_instrs + 8));
    x->marks = *mk;
    if (bucket >= 0 && c->graph[bucket]) return og_cuda_marks_again(*mk, c->stream, -1);
    return og_cuda_marks_start(*mk, c->stream);
}

static og_status cuda_run_step(og_model *m, og_step_ctx *c, const og_step_plan *p) {
    CUDA_TRY(cudaSetDevice(cm_of(m)->device), "cudaSetDevice");
    if (!c->kv_dtype_set) { /* the table kernels of this context serve one kv dtype */
        c->kv_dtype = p->seqs[0].s->cfg.kv_dtype;
        c->kv_dtype_set = true;
    }
    const int32_t bucket = graph_bucket(m, c, p);
    step_run x = {.m = m, .c = c, .plan = p, .B = bucket >= 0 ? 1 << bucket : 0};
    x.rows = x.B > 0 ? x.B : p->n_rows;
    OG_TRY(pick_set(m, c, x.rows, x.B > 0 ? x.B : p->n_tail_rows, &x.rs));
    int32_t n_host = 0;
    /* the pinned block is free: the previous step ended with a synchronization */
    OG_TRY(fill_block(&x, &n_host));
    double t_wait = og_time_now();
    CUDA_TRY(cudaStreamSynchronize(cm_of(m)->store), "KV storage copies");
    *p->wait_seconds += og_time_now() - t_wait;
    int32_t failed = -1;
    og_cuda_profile *pr = cm_of(m)->profile;
    og_status st = pr ? profile_start(&x, bucket) : OG_OK;
    if (st == OG_OK) st = enqueue(&x, bucket, n_host, &failed);
    t_wait = og_time_now();
    cudaError_t e = cudaStreamSynchronize(c->stream);
    *p->wait_seconds += og_time_now() - t_wait;
    if (st == OG_OK && e != cudaSuccess) st = cuda_fail(e, "step");
    if (pr && st == OG_OK) og_cuda_profile_add(pr, x.marks, p->n_seqs, p->n_rows);
    if (st != OG_OK) {
        if (failed >= 0) {
            const og_program_instr *in = og_program_instr_at(m->prog, failed);
            return og_set_error(st, "instruction %d (%s -> %s): %s", failed, og_op_get(in->op)->name, in->out,
                                og_last_error());
        }
        return st;
    }
    const int64_t V = m->vocab;
    int32_t host = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) { /* every token is checked before any sampler moves */
        const og_step_seq *q = &p->seqs[i];
        const og_step_output out = q->item->output;
        if (out != OG_OUTPUT_ARGMAX && out != OG_OUTPUT_SAMPLE) continue;
        const int32_t t = x.rs->next_host[out_row(&x, q)];
        const bool dev = out == OG_OUTPUT_ARGMAX ||
                         device_draws(q->item->sampler, V);
        if (dev && (t < 0 || t >= V))
            return og_set_error(OG_ERR_BACKEND, "the device sampler returned token %d for item of row %d (vocabulary %lld)",
                                (int)t, q->row0, (long long)V);
    }
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const og_step_seq *q = &p->seqs[i];
        og_batch_item *it = q->item;
        if (it->output == OG_OUTPUT_ARGMAX) it->token = x.rs->next_host[out_row(&x, q)];
        if (it->output != OG_OUTPUT_SAMPLE) continue;
        if (device_draws(it->sampler, V)) {
            it->token = x.rs->next_host[out_row(&x, q)];
            og_sampler_commit(it->sampler, it->token);
        } else {
            it->token = og_sampler_sample(it->sampler, c->host_rows + (size_t)host++ * (size_t)V);
        }
    }
    return OG_OK;
}

static og_status cuda_host_thread(og_model *m) {
    CUDA_TRY(cudaSetDevice(cm_of(m)->device), "cudaSetDevice on a thread preparing sessions");
    return OG_OK;
}

const og_backend_ops og_backend_cuda_ops = {
    .name = "cuda",
    .fusion = &og_fuse_rules_cuda,
    .model_init = cuda_model_init,
    .model_free = cuda_model_free,
    .session_init = cuda_session_init,
    .session_free = cuda_session_free,
    .ctx_create = cuda_ctx_create,
    .ctx_free = cuda_ctx_free,
    .step = cuda_run_step,
    .host_thread = cuda_host_thread,
};
