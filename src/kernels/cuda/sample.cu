/* The device sampler (sample_cuda.h): a row is read by a cluster of blocks
 * of 1024 threads (8 while the rows are few, else one), each its slice of
 * the row; rank 0 of the cluster combines their results through distributed
 * shared memory, and draws.
 *
 * Letters (as in sample_cuda.h): V vocabulary, K candidates kept, P the
 * power of two >= K they are sorted in, W = ceil(V / 32) bitmap words.
 *
 * Every logit is read through value(): forbidden -> -inf, then the
 * repetition penalty for ids marked in `marks` (the recent set, marked at the
 * start and cleared at the end), and -0 read as +0 so that the bit order of
 * keys is the CPU's float order. A key is the float's bits mapped so that
 * unsigned order is float order.
 *
 * Greedy: one pass, arg-max with the lower id winning ties; NaN values are
 * skipped, and a NaN at id 0 is the answer, as in the CPU's scan (which
 * starts at id 0 and takes an id only when its value is greater).
 * Top-k: a radix select finds the key of the K-th best (four passes over V,
 * one byte of the key each, histograms with warp-aggregated atomics); one
 * more pass gathers the ids above it and, of those equal to it, the lowest
 * ids (ranked in id order by a block-wide count) so that ties keep the lower
 * id as the CPU does. The K candidates, as 64-bit (key, ~id) words, are
 * sorted descending by a bitonic sort of P in shared memory: the CPU's total
 * order (logit descending, lower id first). Then every thread computes its
 * candidate's exp in double, and thread 0 does the rest in the CPU's order:
 * the double sum, the division, top-p, min-p, the kept mass and the scan.
 * Arithmetic uses the _rn intrinsics so nothing is fused into an fma.
 *
 * The batched sampler runs the same row code in one cluster per row, after
 * reading the row's descriptor (og_sample_cuda_row) from the table; an
 * ARGMAX row is one pass with torch.argmax's order (NaN above every number,
 * first index on ties), the order of og_argmax_cuda. Every branch on the
 * descriptor is uniform over the block, so the __syncthreads inside are
 * reached by all of its threads.
 */
#include "kernels/cuda/sample_cuda.h"

#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxK = OG_SAMPLE_CUDA_MAX_K;
static_assert(kMaxK <= kThreads, "one candidate per thread in the softmax");

__device__ inline bool has_bit(const uint32_t *bits, int64_t i) { return (bits[i >> 5] >> (i & 31)) & 1u; }

/* What the sampler sees of logit i, whose raw value is x; forbidden and
 * marks may be NULL. */
__device__ inline float seen(float x, int64_t i, const uint32_t *forbidden, const uint32_t *marks, float penalty) {
    if (forbidden && has_bit(forbidden, i)) x = -INFINITY;
    if (marks && has_bit(marks, i)) x = x > 0 ? __fdiv_rn(x, penalty) : __fmul_rn(x, penalty);
    return x == 0.0f ? 0.0f : x;
}
__device__ inline float value(const float *logits, int64_t i, const uint32_t *forbidden, const uint32_t *marks,
                              float penalty) {
    return seen(logits[i], i, forbidden, marks, penalty);
}

/* A row's share of one block of its cluster (C blocks a row, rank r): the
 * row's 16-byte-aligned middle (n4 float4s from head) is cut into C
 * contiguous runs of float4s, [j0, j1) for rank r; rank 0 also takes the
 * floats before the middle, rank C - 1 those after it. So ids rise with the
 * rank, and with C = 1 one block reads the whole row. */
struct slice {
    int64_t head, n4, tail, j0, j1;
    bool first, last;
};
__device__ inline slice slice_of(const float *logits, int64_t V, unsigned r, unsigned C) {
    slice s;
    s.head = (int64_t)((16 - ((uintptr_t)logits & 15)) & 15) / (int64_t)sizeof(float);
    if (s.head > V) s.head = V;
    s.n4 = (V - s.head) / 4;
    s.tail = s.head + 4 * s.n4;
    s.j0 = s.n4 * (int64_t)r / (int64_t)C;
    s.j1 = s.n4 * (int64_t)(r + 1) / (int64_t)C;
    s.first = r == 0;
    s.last = r + 1 == C;
    return s;
}

/* Calls visit(x, i) on every logit x = logits[i] of the block's slice, each
 * thread's ids rising. A few blocks read a whole row, so the loads must be
 * wide and many in flight: 16-byte loads, four a thread at a time, over the
 * row's 16-byte-aligned middle, single floats before and after it (a batch's
 * rows start wherever b x V puts them). */
template <class Visit>
__device__ __forceinline__ void scan_slice(const slice &sl, const float *logits, int64_t V, Visit &&visit) {
    const int tid = threadIdx.x;
    if (sl.first && tid < sl.head) visit(logits[tid], (int64_t)tid);
    const float4 *body = reinterpret_cast<const float4 *>(logits + sl.head);
#pragma unroll 4
    for (int64_t j = sl.j0 + tid; j < sl.j1; j += kThreads) {
        const float4 v = body[j];
        const int64_t i = sl.head + 4 * j;
        visit(v.x, i), visit(v.y, i + 1), visit(v.z, i + 2), visit(v.w, i + 3);
    }
    if (sl.last && sl.tail + tid < V) visit(logits[sl.tail + tid], sl.tail + tid);
}

/* Unsigned order of keys is the order of the floats (NaN aside). */
__device__ inline uint32_t key_of(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
__device__ inline float float_of(uint32_t k) { return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k); }

/* A candidate as one word: descending order is (logit desc, id asc); 0 is
 * below every candidate (ids are < 2^31, so the low half is >= 2^31). */
__device__ inline uint64_t cand_of(uint32_t key, int64_t id) {
    return (uint64_t)key << 32 | (uint32_t)~(uint32_t)id;
}
__device__ inline int32_t cand_id(uint64_t c) { return (int32_t)~(uint32_t)c; }
__device__ inline float cand_value(uint64_t c) { return float_of((uint32_t)(c >> 32)); }

struct shared_state {
    uint64_t cand[kMaxK];  /* [P] candidates, sorted descending */
    float prob[kMaxK];     /* [K] probabilities of the sorted candidates */
    uint32_t hist[256];    /* one radix digit's counts */
    uint32_t warp_eq[kWarps];
    float warp_best[kWarps];
    int64_t warp_best_id[kWarps];
    uint32_t tot[256];     /* a digit's counts over the cluster */
    uint32_t digit, remaining, n_gt;
    uint32_t n_gt_local, n_eq_local; /* gather: this block's keys above / at the k-th */
    float part_best;       /* the block's best (value, id): id -1 none */
    int64_t part_best_id;
    double sum;
};

/* The orders of the two arg-max scans; b never wins against itself.
 * sampler_order: the sampler's greedy scan, lower id on ties (NaN values
 * never reach it).
 * torch_order: NaN above every number, then the first index. */
struct sampler_order {
    __device__ static bool better(float a, int64_t ia, float b, int64_t ib) { return a > b || (a == b && ia < ib); }
};
struct torch_order {
    __device__ static bool better(float a, int64_t ia, float b, int64_t ib) {
        const bool na = isnan(a), nb = isnan(b);
        if (na || nb) return na && (!nb || ia < ib);
        return a > b || (a == b && ia < ib);
    }
};

/* The best (value, id) by Order of the per-thread bests (id -1: none) over
 * the block; thread 0 gets it (-1 when no thread has one). */
template <class Order>
__device__ int64_t block_best(shared_state &sh, float best, int64_t best_id) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float b = __shfl_down_sync(0xffffffffu, best, o);
        const int64_t bi = __shfl_down_sync(0xffffffffu, best_id, o);
        if (bi >= 0 && (best_id < 0 || Order::better(b, bi, best, best_id))) best = b, best_id = bi;
    }
    if (lane == 0) sh.warp_best[warp] = best, sh.warp_best_id[warp] = best_id;
    __syncthreads();
    if (tid == 0)
        for (int w = 1; w < kWarps; w++) {
            const float b = sh.warp_best[w];
            const int64_t bi = sh.warp_best_id[w];
            if (bi >= 0 && (best_id < 0 || Order::better(b, bi, best, best_id))) best = b, best_id = bi;
        }
    return best_id;
}

/* The best (value, id) by Order over the cluster, from each thread's best
 * (id -1: none); value_at(id) is the value of an id. Thread 0 of rank 0 gets
 * it (-1 when no block has one); ranks rise with ids, so a later rank's best
 * wins only when better. Every block returns after rank 0 has read the
 * others' shared memory. */
template <class Order, class Value>
__device__ int64_t cluster_best(shared_state &sh, float best, int64_t best_id, Value &&value_at) {
    cg::cluster_group cl = cg::this_cluster();
    best_id = block_best<Order>(sh, best, best_id);
    if (threadIdx.x == 0) {
        sh.part_best_id = best_id;
        sh.part_best = best_id >= 0 ? value_at(best_id) : 0.0f;
    }
    cl.sync();
    if (cl.block_rank() == 0 && threadIdx.x == 0) {
        best = sh.part_best;
        for (unsigned q = 1; q < cl.num_blocks(); q++) {
            const shared_state *o = cl.map_shared_rank(&sh, q);
            const int64_t oi = o->part_best_id;
            const float ov = o->part_best;
            if (oi >= 0 && (best_id < 0 || Order::better(ov, oi, best, best_id))) best = ov, best_id = oi;
        }
    }
    cl.sync(); /* the blocks' shared memory is read: they may leave */
    return best_id;
}

__device__ void greedy(shared_state &sh, const slice &sl, const float *logits, int64_t V, const uint32_t *forbidden,
                       const uint32_t *marks, float penalty, int32_t *token) {
    cg::cluster_group cl = cg::this_cluster();
    const int tid = threadIdx.x;
    float best = 0.0f;
    int64_t best_id = -1; /* -1: none seen */
    scan_slice(sl, logits, V, [&](float raw, int64_t i) {
        const float x = seen(raw, i, forbidden, marks, penalty);
        if (isnan(x)) return;
        if (best_id < 0 || x > best) best = x, best_id = i; /* ids rise: strict > keeps the lowest */
    });
    best_id = cluster_best<sampler_order>(sh, best, best_id,
                                          [&](int64_t i) { return value(logits, i, forbidden, marks, penalty); });
    if (cl.block_rank() == 0 && tid == 0) {
        /* the CPU's scan starts at id 0: a NaN there is never beaten; -1 is
         * only left when every value is NaN, so id 0 is one too */
        if (best_id < 0 || isnan(value(logits, 0, forbidden, marks, penalty))) best_id = 0;
        *token = (int32_t)best_id;
    }
}

/* og_argmax_cuda's answer for one row of raw logits. torch_order is a total
 * order with the lower id winning ties, so the order of the scan does not
 * change the answer. */
__device__ void argmax_row(shared_state &sh, const slice &sl, const float *logits, int64_t V, int32_t *token) {
    cg::cluster_group cl = cg::this_cluster();
    const int tid = threadIdx.x;
    float best = 0.0f;
    int64_t best_id = -1;
    scan_slice(sl, logits, V, [&](float x, int64_t i) {
        if (best_id < 0 || torch_order::better(x, i, best, best_id)) best = x, best_id = i;
    });
    best_id = cluster_best<torch_order>(sh, best, best_id, [&](int64_t i) { return logits[i]; });
    if (cl.block_rank() == 0 && tid == 0) *token = (int32_t)best_id;
}

/* The key of the k-th best value over the cluster's row (radix select, a
 * byte at a time from the top): each block counts its slice's digits, and
 * every block adds the cluster's counts and picks the same digit; sh.n_gt
 * gets how many keys are above it. Every thread of every block returns it. */
__device__ uint32_t kth_key(shared_state &sh, const slice &sl, const float *logits, int64_t V,
                            const uint32_t *forbidden, const uint32_t *marks, float penalty, uint32_t k) {
    cg::cluster_group cl = cg::this_cluster();
    const int tid = threadIdx.x, lane = tid & 31;
    uint32_t prefix = 0, mask = 0, remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        cl.sync(); /* every block has read the last pass's counts */
        for (int d = tid; d < 256; d += kThreads) sh.hist[d] = 0;
        __syncthreads();
        /* whole warps in step, for match_any; the order of ids does not
         * matter to a count: the slice's run of 16-byte loads, then the few
         * single floats before and after the row's middle */
        const auto count = [&](bool valid, float raw, int64_t i) {
            bool in = false;
            uint32_t d = 0;
            if (valid) {
                const uint32_t key = key_of(seen(raw, i, forbidden, marks, penalty));
                in = (key & mask) == prefix;
                d = (key >> shift) & 255u;
            }
            const unsigned active = __ballot_sync(0xffffffffu, in);
            if (in) {
                const unsigned peers = __match_any_sync(active, d);
                if (lane == __ffs(peers) - 1) atomicAdd(&sh.hist[d], (uint32_t)__popc(peers));
            }
        };
        const float4 *body = reinterpret_cast<const float4 *>(logits + sl.head);
        for (int64_t base = sl.j0; base < sl.j1; base += kThreads) {
            const int64_t j = base + tid;
            const bool valid = j < sl.j1;
            const float4 v = valid ? body[j] : make_float4(0, 0, 0, 0);
            const int64_t i = sl.head + 4 * j;
            count(valid, v.x, i), count(valid, v.y, i + 1), count(valid, v.z, i + 2), count(valid, v.w, i + 3);
        }
        /* at most 3 before the middle (rank 0) and 3 after it (the last rank) */
        const int64_t e = tid < 4 ? tid : sl.tail + (tid - 4);
        const bool edge = tid < 8 && (tid < 4 ? sl.first && e < sl.head : sl.last && e < V);
        count(edge, edge ? logits[e] : 0.0f, e);
        cl.sync(); /* every block's counts are in */
        for (int d = tid; d < 256; d += kThreads) {
            uint32_t t = 0;
            for (unsigned q = 0; q < cl.num_blocks(); q++) t += cl.map_shared_rank(sh.hist, q)[d];
            sh.tot[d] = t;
        }
        __syncthreads();
        if (tid == 0) {
            uint32_t above = 0;
            int d = 255;
            for (; d > 0 && above + sh.tot[d] < remaining; d--) above += sh.tot[d];
            sh.digit = (uint32_t)d;
            sh.remaining = remaining - above;
        }
        __syncthreads();
        prefix |= sh.digit << shift;
        mask |= 255u << shift;
        remaining = sh.remaining;
    }
    if (tid == 0) sh.n_gt = k - remaining;
    __syncthreads();
    return prefix;
}

/* One round of gather: each thread holds up to four keys of consecutive ids
 * from i0 (bit c of valid: key c is one), the threads' ids rising with tid
 * and every round's above the last one's. Keys above kth are appended to the
 * block's own in any order; of those equal to it, the block's need_eq lowest
 * ids are kept after the n_gt slots of the ones above (eq_before: equal keys
 * of the block's earlier rounds). */
__device__ void gather_round(shared_state &sh, const uint32_t (&key)[4], int64_t i0, unsigned valid, uint32_t kth,
                             uint32_t n_gt, uint32_t need_eq, uint32_t &eq_before) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint32_t mine = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        if (!((valid >> c) & 1u)) continue;
        if (key[c] > kth) sh.cand[atomicAdd(&sh.n_gt_local, 1u)] = cand_of(key[c], i0 + c);
        else if (key[c] == kth) mine++;
    }
    uint32_t incl = mine; /* equal keys of this warp up to this thread */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) sh.warp_eq[warp] = incl;
    __syncthreads();
    uint32_t rank = eq_before + incl - mine, total = 0;
    for (int w = 0; w < kWarps; w++) {
        if (w < warp) rank += sh.warp_eq[w];
        total += sh.warp_eq[w];
    }
#pragma unroll
    for (int c = 0; c < 4; c++)
        if (((valid >> c) & 1u) && key[c] == kth) {
            if (rank < need_eq) sh.cand[n_gt + rank] = cand_of(key[c], i0 + c);
            rank++;
        }
    eq_before += total;
    __syncthreads(); /* warp_eq is rewritten by the next round */
}

/* Gathers the k best of the cluster's row into rank 0's sh.cand[0, k): every
 * key above kth (in any order), then the lowest ids of those equal to it.
 * Each block gathers its slice in rounds of rising ids (the floats before the
 * row's 16-byte-aligned middle, its run of 16-byte loads, the floats after):
 * its keys above kth at its cand[0, gt), its lowest equal ones at cand[n_gt,
 * ...). Rank 0 then appends the other blocks' in rank order: ids rise with
 * the rank, so the equal keys it keeps are still the lowest ids. */
__device__ void gather(shared_state &sh, const slice &sl, const float *logits, int64_t V, const uint32_t *forbidden,
                       const uint32_t *marks, float penalty, uint32_t k, uint32_t kth) {
    cg::cluster_group cl = cg::this_cluster();
    const int tid = threadIdx.x;
    const uint32_t n_gt = sh.n_gt, need_eq = k - n_gt;
    if (tid == 0) sh.n_gt_local = 0;
    __syncthreads();
    uint32_t eq_before = 0;
    uint32_t key[4] = {0, 0, 0, 0};
    const bool before = sl.first && tid < sl.head;
    if (before) key[0] = key_of(value(logits, tid, forbidden, marks, penalty));
    gather_round(sh, key, tid, before ? 1u : 0u, kth, n_gt, need_eq, eq_before);
    const float4 *body = reinterpret_cast<const float4 *>(logits + sl.head);
    for (int64_t base = sl.j0; base < sl.j1; base += kThreads) {
        const int64_t j = base + tid, i = sl.head + 4 * j;
        const bool in = j < sl.j1;
        if (in) {
            const float4 v = body[j];
            key[0] = key_of(seen(v.x, i, forbidden, marks, penalty));
            key[1] = key_of(seen(v.y, i + 1, forbidden, marks, penalty));
            key[2] = key_of(seen(v.z, i + 2, forbidden, marks, penalty));
            key[3] = key_of(seen(v.w, i + 3, forbidden, marks, penalty));
        }
        gather_round(sh, key, i, in ? 15u : 0u, kth, n_gt, need_eq, eq_before);
    }
    const bool after = sl.last && sl.tail + tid < V;
    if (after) key[0] = key_of(value(logits, sl.tail + tid, forbidden, marks, penalty));
    gather_round(sh, key, sl.tail + tid, after ? 1u : 0u, kth, n_gt, need_eq, eq_before);
    if (tid == 0) sh.n_eq_local = eq_before;
    cl.sync(); /* every block's candidates are in */
    if (cl.block_rank() == 0) {
        uint32_t gt_at = sh.n_gt_local, eq_at = eq_before < need_eq ? eq_before : need_eq;
        for (unsigned q = 1; q < cl.num_blocks(); q++) {
            const shared_state *o = cl.map_shared_rank(&sh, q);
            const uint32_t gt = o->n_gt_local, eq_all = o->n_eq_local;
            const uint32_t eq = eq_all < need_eq - eq_at ? eq_all : need_eq - eq_at;
            for (uint32_t i = tid; i < gt; i += kThreads) sh.cand[gt_at + i] = o->cand[i];
            for (uint32_t i = tid; i < eq; i += kThreads) sh.cand[n_gt + eq_at + i] = o->cand[n_gt + i];
            gt_at += gt, eq_at += eq;
        }
    }
    cl.sync(); /* the blocks' shared memory is read: they may leave */
    __syncthreads();
}

/* Sorts sh.cand[0, P) descending; entries k..P-1 are padded with 0. */
__device__ void sort_candidates(shared_state &sh, uint32_t k) {
    const int tid = threadIdx.x;
    uint32_t P = 1;
    while (P < k) P <<= 1;
    for (uint32_t i = k + tid; i < P; i += kThreads) sh.cand[i] = 0;
    for (uint32_t size = 2; size <= P; size <<= 1)
        for (uint32_t stride = size / 2; stride > 0; stride >>= 1) {
            __syncthreads();
            for (uint32_t i = tid; i < P; i += kThreads) {
                const uint32_t j = i ^ stride;
                if (j <= i) continue;
                const bool descending = (i & size) == 0;
                const uint64_t a = sh.cand[i], b = sh.cand[j];
                if ((a < b) == descending) sh.cand[i] = b, sh.cand[j] = a;
            }
        }
    __syncthreads();
}

/* The softmax, top-p, min-p and the draw over the sorted candidates, as
 * og_sampler_sample does them. */
__device__ void draw(shared_state &sh, const og_sample_cuda_step *step, uint32_t k, int32_t *token) {
    const int tid = threadIdx.x;
    const double temperature = step->temperature, mx = cand_value(sh.cand[0]);
    if ((uint32_t)tid < k) sh.prob[tid] = (float)exp(__ddiv_rn(__dsub_rn((double)cand_value(sh.cand[tid]), mx), temperature));
    __syncthreads();
    if (tid == 0) {
        double sum = 0;
        for (uint32_t i = 0; i < k; i++) sum = __dadd_rn(sum, (double)sh.prob[i]);
        sh.sum = sum;
    }
    __syncthreads();
    if ((uint32_t)tid < k) sh.prob[tid] = (float)__ddiv_rn((double)sh.prob[tid], sh.sum);
    __syncthreads();
    if (tid != 0) return;
    const float top_p = step->top_p, min_p = step->min_p;
    uint32_t n = k;
    if (top_p < 1) {
        double mass = 0;
        uint32_t m = 0;
        while (m < n && mass < (double)top_p) mass = __dadd_rn(mass, (double)sh.prob[m++]);
        n = m > 0 ? m : 1;
    }
    if (min_p > 0) {
        uint32_t m = 1;
        while (m < n && sh.prob[m] >= __fmul_rn(min_p, sh.prob[0])) m++;
        n = m;
    }
    double total = 0;
    for (uint32_t i = 0; i < n; i++) total = __dadd_rn(total, (double)sh.prob[i]);
    const double r = __dmul_rn(step->uniform, total);
    double acc = 0;
    int32_t tok = cand_id(sh.cand[n - 1]);
    for (uint32_t i = 0; i < n; i++)
        if ((acc = __dadd_rn(acc, (double)sh.prob[i])) > r) {
            tok = cand_id(sh.cand[i]);
            break;
        }
    *token = tok;
}

/* og_sample_cuda's work for one row, by every block of the cluster (each
 * reads its slice; rank 0 marks the recent ids, sorts, draws and writes the
 * token). */
__device__ void sample_row(shared_state &sh, const float *logits, int64_t V, const og_sample_cuda_step *step,
                           const int32_t *recent, const uint32_t *forbidden_bits, uint32_t *marks, int32_t *token) {
    cg::cluster_group cl = cg::this_cluster();
    const int tid = threadIdx.x;
    const bool lead = cl.block_rank() == 0;
    const slice sl = slice_of(logits, V, cl.block_rank(), cl.num_blocks());
    const float penalty = step->repeat_penalty, temperature = step->temperature;
    const int32_t top_k = step->top_k;
    const int32_t n_recent = penalty != 1.0f ? step->n_recent : 0;
    const uint32_t *forbidden = step->use_forbidden ? forbidden_bits : nullptr;
    for (int32_t j = tid; lead && j < n_recent; j += kThreads) {
        const int32_t t = recent[j];
        if (t >= 0 && t < V) atomicOr(&marks[t >> 5], 1u << (t & 31));
    }
    cl.sync(); /* the marks are set before any block reads them */
    const uint32_t *marked = n_recent > 0 ? marks : nullptr;
    if (temperature <= 0) {
        greedy(sh, sl, logits, V, forbidden, marked, penalty, token);
    } else {
        const int64_t k = top_k > 0 && top_k < V ? top_k : V;
        if (k > kMaxK) {
            if (lead && tid == 0) *token = -1;
        } else {
            const uint32_t kth = kth_key(sh, sl, logits, V, forbidden, marked, penalty, (uint32_t)k);
            gather(sh, sl, logits, V, forbidden, marked, penalty, (uint32_t)k, kth);
            if (!lead) return; /* every block's reads of marks are done (gather's last cluster sync) */
            sort_candidates(sh, (uint32_t)k);
            draw(sh, step, (uint32_t)k, token);
        }
    }
    if (!lead) return;
    __syncthreads(); /* every read of marks is done (and the other blocks' before the cluster syncs) */
    for (int32_t j = tid; j < n_recent; j += kThreads) {
        const int32_t t = recent[j];
        if (t >= 0 && t < V) marks[t >> 5] = 0; /* only recent ids are ever marked */
    }
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float *logits, int64_t V, const og_sample_cuda_step *step, const int32_t *recent,
                  const uint32_t *forbidden_bits, uint32_t *marks, int32_t *token) {
    __shared__ shared_state sh;
    sample_row(sh, logits, V, step, recent, forbidden_bits, marks, token);
}

/* Cluster c (blocks c C .. c C + C - 1) serves row c; every branch on the
 * row's descriptor is uniform over the cluster, so its cluster syncs are
 * reached by all of its blocks. */
__global__ void __launch_bounds__(kThreads)
    sample_batch_kernel(const float *logits, int64_t V, const og_sample_cuda_row *rows, int32_t *tokens) {
    __shared__ shared_state sh;
    cg::cluster_group cl = cg::this_cluster();
    const int64_t b = (int64_t)blockIdx.x / cl.num_blocks();
    const og_sample_cuda_row *row = rows + b;
    const float *x = logits + b * V;
    int32_t *token = tokens + b;
    const int32_t mode = row->mode;
    if (mode == OG_SAMPLE_ROW_ARGMAX) {
        argmax_row(sh, slice_of(x, V, cl.block_rank(), cl.num_blocks()), x, V, token);
        return;
    }
    if (mode == OG_SAMPLE_ROW_SAMPLE) {
        const og_sample_cuda_step *step = &row->step;
        const int32_t *recent = row->recent;
        const uint32_t *forbidden = row->forbidden;
        uint32_t *marks = row->marks;
        const bool penalized = step->repeat_penalty != 1.0f && step->n_recent > 0;
        if ((!penalized || (recent && marks)) && (!step->use_forbidden || forbidden)) {
            sample_row(sh, x, V, step, recent, forbidden, marks, token);
            return;
        }
    }
    if (cl.block_rank() == 0 && threadIdx.x == 0) *token = -1; /* NONE, a row missing a buffer, an unknown mode */
}

/* Blocks a row: a few rows spread over clusters of 8 blocks (so that one
 * row is read by 8 SMs), many rows a block each (the rows fill the device
 * already). OG_CUDA_SAMPLE_CLUSTER sets the cluster (0 or 1: a block a row
 * always; 2, 4 or 8), for measurements: the token is the same either way. */
inline unsigned blocks_a_row(int64_t B) {
    static const unsigned cluster = [] {
        const char *v = getenv("OG_CUDA_SAMPLE_CLUSTER");
        const long c = v && *v ? strtol(v, nullptr, 10) : 8;
        return c == 2 || c == 4 || c == 8 ? (unsigned)c : 1u;
    }();
    return B * cluster <= 256 ? cluster : 1;
}

/* Launches kernel over B rows, C blocks a row in clusters of C. */
template <class... Args>
cudaError_t launch_rows(void (*kernel)(Args...), int64_t B, cudaStream_t stream, Args... args) {
    const unsigned C = blocks_a_row(B);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = C;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)B * C);
    cfg.blockDim = dim3(kThreads);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Row blockIdx.x, when it names a mask: logits whose bit is clear -> -inf;
 * the blocks of a row (blockIdx.y) stride over its V logits, a thread per
 * logit, so that a warp reads one mask word and writes 32 neighbours. */
constexpr int kMaskThreads = 256;
constexpr int kMaskBlocksPerRow = 64;
__global__ void __launch_bounds__(kMaskThreads)
    mask_kernel(float *logits, int64_t V, const int32_t *mask_of, const uint32_t *masks) {
    const int64_t b = blockIdx.x;
    const int32_t k = mask_of[b];
    if (k <= 0) return;
    const int64_t W = (V + 31) / 32;
    const uint32_t *mask = masks + (int64_t)(k - 1) * W;
    float *x = logits + b * V;
    for (int64_t i = (int64_t)blockIdx.y * kMaskThreads + threadIdx.x; i < V;
         i += (int64_t)gridDim.y * kMaskThreads)
        if (!((mask[i >> 5] >> (i & 31)) & 1u)) x[i] = -INFINITY;
}

static_assert(sizeof(og_sample_cuda_step) == 40, "og_sample_cuda_step layout");
static_assert(sizeof(og_sample_cuda_row) == 72 && offsetof(og_sample_cuda_row, step) == 8 &&
                  offsetof(og_sample_cuda_row, recent) == 48 && offsetof(og_sample_cuda_row, marks) == 64,
              "og_sample_cuda_row layout");

og_status launched(const char *what) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return OG_OK;
    return og_set_error(OG_ERR_BACKEND, "%s: launch: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

} /* namespace */

extern "C" bool og_sample_cuda_supported(float temperature, int32_t top_k, int64_t V) {
    const int64_t k = top_k > 0 && top_k < V ? top_k : V;
    return temperature <= 0 || k <= kMaxK;
}

extern "C" og_status og_sample_cuda(void *stream, const float *logits, int64_t V, const og_sample_cuda_step *step,
                                    const int32_t *recent, const uint32_t *forbidden, uint32_t *marks,
                                    int32_t *token) {
    if (!logits || !step || !recent || !forbidden || !marks || !token)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "sample_cuda: a NULL buffer");
    if (V < 1 || V > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "sample_cuda: V = %lld is outside [1, INT32_MAX]", (long long)V);
    (void)launch_rows(sample_kernel, 1, static_cast<cudaStream_t>(stream), logits, V, step, recent,
                      (const uint32_t *)forbidden, marks, token);
    return launched("sample_cuda");
}

extern "C" size_t og_sample_cuda_marks_bytes(int64_t V) {
    return V < 1 ? 0 : (size_t)((V + 31) / 32) * sizeof(uint32_t);
}

extern "C" og_status og_sample_batch_cuda(void *stream, const float *logits, int64_t V, int32_t B,
                                          const og_sample_cuda_row *rows, int32_t *tokens) {
    if (!logits || !rows || !tokens)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "sample_batch_cuda: a NULL buffer");
    if (V < 1 || V > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "sample_batch_cuda: V = %lld is outside [1, INT32_MAX]",
                            (long long)V);
    if (B < 1) return og_set_error(OG_ERR_INVALID_ARGUMENT, "sample_batch_cuda: B = %d rows", (int)B);
    (void)launch_rows(sample_batch_kernel, B, static_cast<cudaStream_t>(stream), logits, V, rows, tokens);
    return launched("sample_batch_cuda");
}

extern "C" og_status og_mask_logits_cuda(void *stream, float *logits, int64_t V, int32_t B, const int32_t *mask_of,
                                         const uint32_t *masks) {
    if (!logits || !mask_of || !masks) return og_set_error(OG_ERR_INVALID_ARGUMENT, "mask_logits_cuda: a NULL buffer");
    if (V < 1 || V > INT32_MAX)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "mask_logits_cuda: V = %lld is outside [1, INT32_MAX]",
                            (long long)V);
    if (B < 1) return og_set_error(OG_ERR_INVALID_ARGUMENT, "mask_logits_cuda: B = %d rows", (int)B);
    const int64_t per_row = (V + kMaskThreads - 1) / kMaskThreads;
    const dim3 grid((unsigned)B, (unsigned)(per_row < kMaskBlocksPerRow ? per_row : kMaskBlocksPerRow));
    mask_kernel<<<grid, kMaskThreads, 0, static_cast<cudaStream_t>(stream)>>>(logits, V, mask_of, masks);
    return launched("mask_logits_cuda");
}
