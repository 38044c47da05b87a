/* update_and_attend on CUDA: the contract of DESIGN.md section 2. This file
 * holds the host entry points (single-session and batched), which check the
 * arguments and choose a kernel, and the split-K kernel on the CUDA cores;
 * attend_mma.cu holds split-K on the tensor cores, attend_prefill.cu the
 * tiled prefill kernel, attend_common.cuh the letters and what they share.
 *
 * Paths:
 *   split-K (decode, and any step over f32 storage or a head dim the tiled
 *   kernel lacks), one launch, grid (T, Hkv x head chunks, most splits).
 *   A block reads the keys and values of one kv head in one split of one
 *   row once, for the GM query heads it serves. Stored keys come through a
 *   pipeline of kStages tiles in shared memory (cp.async: each thread has
 *   8 16-byte copies per tile in flight, two tiles ahead of the one being
 *   consumed). Its 128 threads form workers of D/8 lanes; a worker takes
 *   8 / sizeof(KV) keys of each tile (each lane 8 of its D elements), reduces
 *   the dot products across its lanes by shuffles and keeps an online
 *   softmax (max, sum, acc) per query head in registers. Keys of this step
 *   (positions >= L) are read from k, v themselves (rounded as storage
 *   rounds them), and the block holding a row's own position writes that
 *   row's k, v to storage: no separate write launch, and no block reads a
 *   row another block writes. The workers' partials are merged in shared
 *   memory by max-rescaling; a row with one split writes its output,
 *   otherwise the block writes a partial (max, sum, acc) per query head to
 *   scratch and counts itself done; the last of the S blocks merges the S
 *   partials and sets the counter back to 0.
 *   tiled (prefill, T > 1, bf16 storage, D in 16..128): attend_prefill.cu.
 *   split-K on the tensor cores (bf16 storage, D 64 or 128; the default,
 *   OG_CUDA_ATTEND=simt or og_attend_cuda_set_decode select the CUDA-core
 *   kernel instead): attend_mma.cu.
 * batched decode (og_update_and_attend_batch_cuda): the split-K kernel with
 *   blockIdx.x an entry b of a device table (og_attend_cuda_seq) instead of
 *   a token: the block reads its entry's storage bases, row stride, length,
 *   rows and window when it starts, so a graph captured once per batch size
 *   follows whatever the host wrote to the table before the replay. Grid
 *   (B, Hkv x head chunks, depth): depth is the most splits any entry may
 *   use (from max_keys, capped where B x row blocks fill one wave of kWave
 *   blocks per SM); each entry splits its own live keys (splits_for) and
 *   blocks past its split count, and every block of a padded entry (T = 0),
 *   leave at once. Split counters and partials are indexed by entry as they
 *   are by token in a single-session launch.
 * int8 and fp8 storage (core/kv_quant.h: a row is Hkv x D quant bytes, then
 *   Hkv f32 scales) runs the split-K kernel, prefill included: tiles carry
 *   the quants (D bytes a key), a worker reads its keys' k and v scales
 *   from the row tails in global memory (one word per key, L2-resident)
 *   and folds them into the score (q . k_quant x k scale) and the weight of
 *   the value (p x v scale); a worker's 8 keys of a tile go 4 at a time
 *   (8 scores per head beside q and acc of 4 heads would spill). The step's own keys are rounded as the row
 *   write rounds them (amax over the head by shuffles across the worker's
 *   lanes), and the row is written with the same f32 divisions and round-
 *   to-nearest-even conversions (rintf, __nv_cvt_float_to_fp8 satfinite) as
 *   the CPU quantizer, so the bytes stored match the CPU's.
 */
#include "kernels/cuda/attend_common.cuh"

#include <stdlib.h>
#include <string.h>

namespace og_attend {

namespace {

/* Starts copying the storage rows of keys j0 .. j0 + KT - 1 of kv head hk
 * into a K tile and a V tile ([KT, D] of KV each, KT = kTileBytes / (D x
 * sizeof(KV))); rows of keys at or past `end` are zero-filled. */
template <typename KV>
__device__ inline void tile_load(const attend_params &p, const kv_store &st, int32_t hk, int64_t j0, int64_t end,
                                 unsigned char *kt, unsigned char *vt) {
    const int32_t piece_shift = __ffs(p.D * (int)sizeof(KV) / 16) - 1; /* log2 of the 16-byte pieces of a row */
    const int64_t row_bytes = st.RS * (int64_t)sizeof(KV);
    const unsigned char *kb = st.k + (int64_t)hk * p.D * (int64_t)sizeof(KV);
    const unsigned char *vb = st.v + (int64_t)hk * p.D * (int64_t)sizeof(KV);
#pragma unroll
    for (int i = 0; i < kPieces; i++) {
        const int c = threadIdx.x + i * kThreads; /* piece c: row c >> shift, 16 bytes at (c & mask) * 16 */
        const int64_t j = j0 + (c >> piece_shift);
        const bool ok = j < end;
        const int64_t slot = ok ? (p.ring ? j % st.R : j) : 0;
        const int64_t off = slot * row_bytes + (int64_t)(c & ((1 << piece_shift) - 1)) * 16;
        copy16_async(kt + c * 16, kb + off, ok);
        copy16_async(vt + c * 16, vb + off, ok);
    }
}

/* Sums every score across the lanes of its worker. */
template <int NK, int GM>
__device__ inline void lane_sum(float (&s)[NK][GM], int32_t lanes) {
    for (int o = lanes / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int u = 0; u < NK; u++)
#pragma unroll
            for (int g = 0; g < GM; g++) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], o);
    }
}

/* Folds NK scores per query head (log2 domain, -inf where there is no key)
 * into the running maximum m and sum l, rescales acc, and turns the scores
 * into the weights of their values. */
template <int NK, int GM>
__device__ inline void softmax_step(float (&s)[NK][GM], float (&m)[GM], float (&l)[GM], float (&acc)[GM][kE]) {
#pragma unroll
    for (int g = 0; g < GM; g++) {
        float mx = m[g];
#pragma unroll
        for (int u = 0; u < NK; u++) mx = fmaxf(mx, s[u][g]);
        const float base = mx == -INFINITY ? 0.0f : mx; /* no key yet: every weight is exp2(-inf) = 0 */
        const float c = exp2f(m[g] - base);
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < NK; u++) {
            s[u][g] = exp2f(s[u][g] - base);
            sum += s[u][g];
        }
        l[g] = fmaf(l[g], c, sum);
#pragma unroll
        for (int e = 0; e < kE; e++) acc[g][e] *= c;
        m[g] = mx;
    }
}

template <int GM>
__device__ inline void dot_heads(const float (&q)[GM][kE], const float (&kf)[kE], float (&s)[GM]) {
#pragma unroll
    for (int g = 0; g < GM; g++) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < kE; e++) d = fmaf(q[g][e], kf[e], d);
        s[g] = d;
    }
}

template <int GM>
__device__ inline void add_values(const float (&w)[GM], const float (&vf)[kE], float (&acc)[GM][kE]) {
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int e = 0; e < kE; e++) acc[g][e] = fmaf(w[g], vf[e], acc[g][e]);
}

/* GM 8 holds twice the registers (q and acc of 8 heads): it runs half as many
 * blocks per SM rather than spill. BATCH: blockIdx.x is an entry of the
 * table p.seqs (one token at its own length), else a token of one session. */
template <typename KV, int GM, bool BATCH>
__global__ void __launch_bounds__(kThreads, GM > 4 ? kWave / 2 : kWave) attend_kernel(attend_params p) {
    constexpr int KPW = 8 / (int)sizeof(KV); /* keys of a tile per worker: KT / NW = 8 / sizeof(KV) */
    const int32_t hk = blockIdx.y / p.chunks, chunk_i = blockIdx.y % p.chunks;
    const int32_t h0 = hk * p.G + chunk_i * GM;
    const int32_t g_n = min(GM, p.G - chunk_i * GM);
    /* t: the row of q, k, v, out (and of the split counters and partials);
     * the step's keys of this row's session start at row t - (pos - L) */
    const int32_t t = blockIdx.x;
    row_geom rg;
    if (!block_row<KV, BATCH>(p, t, h0, g_n, rg)) return;
    const int64_t L = rg.L, pos = rg.pos;
    const kv_store &st = rg.st;
    const int32_t W = rg.W;
    const int64_t lo = first_key(p.ring, W, pos);
    int64_t chunk;
    const int32_t S = splits_for(pos - lo + 1, p.max_splits, p.split_keys, &chunk);
    const int32_t split = blockIdx.z;
    if (split >= S) return; /* the whole block leaves: no barrier is skipped */
    const int64_t k0 = lo + split * chunk;
    const int64_t k1 = min(k0 + chunk, pos + 1);

    const int32_t lanes = p.lanes, D = p.D;
    const int32_t worker = threadIdx.x / lanes, li = threadIdx.x % lanes;
    const int32_t NW = kThreads / lanes;

    float q[GM][kE], m[GM], l[GM], acc[GM][kE];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g < g_n) {
            load8(p.q + ((int64_t)t * p.Hq + h0 + g) * D + li * kE, q[g]);
#pragma unroll
            for (int e = 0; e < kE; e++) q[g][e] *= p.scale_log2;
        } else {
#pragma unroll
            for (int e = 0; e < kE; e++) q[g][e] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < kE; e++) acc[g][e] = 0.0f;
    }

    /* 1. stored keys k0 .. ks-1 through a pipeline of kStages K/V tiles:
     * tile i lands in buffer i % kStages while tiles i+1, i+2 are in flight. */
    extern __shared__ __align__(16) unsigned char smem[];
    const int32_t KT = kTileBytes / (D * (int32_t)sizeof(KV));
    const int64_t ks = min(k1, L);
    const int64_t n_tiles = ks > k0 ? (ks - k0 + KT - 1) / KT : 0;
#pragma unroll
    for (int i = 0; i < kStages - 1; i++) {
        if (i < n_tiles) tile_load<KV>(p, st, hk, k0 + (int64_t)i * KT, ks, smem + 2 * i * kTileBytes,
                                       smem + (2 * i + 1) * kTileBytes);
        copies_commit(); /* an empty group where there is no tile keeps the count per tile */
    }
    for (int64_t i = 0; i < n_tiles; i++) {
        copies_wait<kStages - 2>(); /* this thread's pieces of tile i are in */
        __syncthreads();            /* everyone's are, and tile i - 1 is consumed */
        const int64_t next = i + kStages - 1;
        if (next < n_tiles) {
            const int b = (int)(next % kStages);
            tile_load<KV>(p, st, hk, k0 + next * KT, ks, smem + 2 * b * kTileBytes, smem + (2 * b + 1) * kTileBytes);
        }
        copies_commit();
        const int b = (int)(i % kStages);
        const KV *kt = reinterpret_cast<const KV *>(smem + 2 * b * kTileBytes) + li * kE;
        const KV *vt = reinterpret_cast<const KV *>(smem + (2 * b + 1) * kTileBytes) + li * kE;
        const int64_t j0 = k0 + i * KT;
        /* the worker's KPW keys of the tile, KH at a time: one byte a quant
         * makes KPW 8, and scores of 8 keys beside q and acc of 4 heads
         * would spill at GM 4; halves cost one more rescale of acc */
        constexpr int KH = KPW > 4 ? 4 : KPW;
#pragma unroll
        for (int h0 = 0; h0 < KPW; h0 += KH) {
            float s[KH][GM];
            float ksc[KH], vsc[KH]; /* quantized storage: the keys' k and v scales of head hk (not in the tiles) */
            if constexpr (kv_quant<KV>::value) {
                const int64_t tail = (int64_t)p.Hkv * D + (int64_t)hk * OG_KV_SCALE_BYTES; /* bytes into a row */
#pragma unroll
                for (int u = 0; u < KH; u++) {
                    const int64_t j = j0 + worker + (h0 + u) * NW;
                    ksc[u] = vsc[u] = 0.0f;
                    if (j < ks) {
                        const int64_t at = (p.ring ? j % st.R : j) * st.RS + tail;
                        ksc[u] = *reinterpret_cast<const float *>(st.k + at);
                        vsc[u] = *reinterpret_cast<const float *>(st.v + at);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < KH; u++) {
                float kf[kE];
                load8(kt + (int64_t)(worker + (h0 + u) * NW) * D, kf);
                dot_heads<GM>(q, kf, s[u]);
            }
            lane_sum<KH, GM>(s, lanes);
#pragma unroll
            for (int u = 0; u < KH; u++) {
                if (j0 + worker + (h0 + u) * NW >= ks) {
#pragma unroll
                    for (int g = 0; g < GM; g++) s[u][g] = -INFINITY;
                } else if constexpr (kv_quant<KV>::value) { /* q . (k quants) x k scale */
#pragma unroll
                    for (int g = 0; g < GM; g++) s[u][g] *= ksc[u];
                }
            }
            softmax_step<KH, GM>(s, m, l, acc);
#pragma unroll
            for (int u = 0; u < KH; u++) { /* rows past ks are zeros with weight 0 */
                float vf[kE];
                load8(vt + (int64_t)(worker + (h0 + u) * NW) * D, vf);
                if constexpr (kv_quant<KV>::value) { /* the weight times the v scale: p x (v quants x v scale) */
#pragma unroll
                    for (int g = 0; g < GM; g++) s[u][g] *= vsc[u];
                }
                add_values<GM>(s[u], vf, acc);
            }
        }
    }
    copies_wait<0>();

    /* 2. keys of this step (positions >= L): from k, v as storage will hold them */
    const int64_t row = (int64_t)p.Hkv * D; /* elements between rows of k, v */
    const int64_t kn0 = max(k0, L);
    const int64_t row0 = t - (pos - L);      /* the row of k, v holding position L */
    const float *knew = p.k + row0 * row + (int64_t)hk * D + li * kE;
    const float *vnew = p.v + row0 * row + (int64_t)hk * D + li * kE;
    for (int64_t j_base = kn0; j_base < k1; j_base += NW) { /* the same trip count for every thread */
        const int64_t j = j_base + worker;
        const bool valid = j < k1;
        float kf[kE], vf[kE], s[1][GM];
        if (valid) {
            load8(knew + (j - L) * row, kf);
            load8(vnew + (j - L) * row, vf);
        } else {
#pragma unroll
            for (int e = 0; e < kE; e++) kf[e] = vf[e] = 0.0f;
        }
        round_as_stored<KV>(kf, lanes);
        round_as_stored<KV>(vf, lanes);
        dot_heads<GM>(q, kf, s[0]);
        lane_sum<1, GM>(s, lanes);
        if (!valid) {
#pragma unroll
            for (int g = 0; g < GM; g++) s[0][g] = -INFINITY;
        }
        softmax_step<1, GM>(s, m, l, acc);
        add_values<GM>(s[0], vf, acc);
    }

    /* the block holding the row's own position stores its k, v */
    if (split == S - 1 && chunk_i == 0) write_own_row<KV>(p, st, pos, t, hk);

    /* 3. merge the workers in shared memory (the tiles are consumed):
     * [NW, GM] maxima and sums, [NW, GM, D] accumulators */
    __syncthreads();
    float *sm = reinterpret_cast<float *>(smem);
    float *sm_m = sm, *sm_l = sm + NW * GM, *sm_acc = sm + 2 * NW * GM;
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (li == 0) {
            sm_m[worker * GM + g] = m[g];
            sm_l[worker * GM + g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < kE; e++) sm_acc[(worker * GM + g) * D + li * kE + e] = acc[g][e];
    }
    __syncthreads();
    finish_split<GM>(p, sm, NW, g_n, h0, t, S, split);
}

template <typename KV, bool BATCH>
cudaError_t launch_attend(const attend_params &p, int gm, dim3 grid, cudaStream_t st) {
    switch (gm) {
    case 1: attend_kernel<KV, 1, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    case 2: attend_kernel<KV, 2, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    case 4: attend_kernel<KV, 4, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    default: attend_kernel<KV, 8, BATCH><<<grid, kThreads, kSmem, st>>>(p); break;
    }
    return cudaGetLastError();
}

bool aligned16(const void *ptr) { return ((uintptr_t)ptr & 15u) == 0; }

og_status launch_failed(const char *what, cudaError_t e) {
    return og_set_error(OG_ERR_BACKEND, "update_and_attend_cuda: %s launch: %s (%s)", what, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

} /* namespace */

} /* namespace og_attend */

using namespace og_attend;

/* The decode kernel choice: -1 until the first call reads OG_CUDA_ATTEND. */
static std::atomic<int> g_decode{-1};

extern "C" og_attend_cuda_decode og_attend_cuda_get_decode(void) {
    int d = g_decode.load(std::memory_order_relaxed);
    if (d < 0) {
        const char *env = getenv("OG_CUDA_ATTEND");
        /* the tensor-core kernel by default (faster at every history measured:
         * bench_attend_cuda, 4k 21.4 -> 16.4 us, 128k 174 -> 139 us);
         * OG_CUDA_ATTEND=simt keeps the CUDA-core kernel */
        d = env && !strcmp(env, "simt") ? OG_ATTEND_CUDA_SIMT : OG_ATTEND_CUDA_MMA;
        int expect = -1;
        if (!g_decode.compare_exchange_strong(expect, d)) d = expect; /* another thread read it first */
    }
    return (og_attend_cuda_decode)d;
}

extern "C" og_attend_cuda_decode og_attend_cuda_set_decode(og_attend_cuda_decode d) {
    const og_attend_cuda_decode prev = og_attend_cuda_get_decode();
    g_decode.store(d == OG_ATTEND_CUDA_MMA ? OG_ATTEND_CUDA_MMA : OG_ATTEND_CUDA_SIMT);
    return prev;
}

/* Keys a split takes (og_attend_cuda_set_split_keys). */
static std::atomic<int32_t> g_split_keys{OG_ATTEND_CUDA_SPLIT_KEYS};

extern "C" int32_t og_attend_cuda_get_split_keys(void) { return g_split_keys.load(std::memory_order_relaxed); }

extern "C" int32_t og_attend_cuda_set_split_keys(int32_t keys) {
    return g_split_keys.exchange(keys >= 1 ? keys : OG_ATTEND_CUDA_SPLIT_KEYS);
}

/* The kernel of int8 / fp8 steps on the tensor cores: -1 until the first
 * call reads OG_CUDA_ATTEND_QMMA. */
static std::atomic<int> g_quant{-1};

extern "C" og_attend_cuda_quant_decode og_attend_cuda_get_quant_decode(void) {
    int d = g_quant.load(std::memory_order_relaxed);
    if (d < 0) {
        const char *env = getenv("OG_CUDA_ATTEND_QMMA");
        d = !env ? OG_ATTEND_CUDA_QUANT_MMA
            : !strcmp(env, "0") ? OG_ATTEND_CUDA_QUANT_SIMT
            : !strcmp(env, "widen") ? OG_ATTEND_CUDA_QUANT_WIDEN
                                    : OG_ATTEND_CUDA_QUANT_MMA;
        int expect = -1;
        if (!g_quant.compare_exchange_strong(expect, d)) d = expect; /* another thread read it first */
    }
    return (og_attend_cuda_quant_decode)d;
}

extern "C" og_attend_cuda_quant_decode og_attend_cuda_set_quant_decode(og_attend_cuda_quant_decode d) {
    const og_attend_cuda_quant_decode prev = og_attend_cuda_get_quant_decode();
    g_quant.store(d == OG_ATTEND_CUDA_QUANT_SIMT || d == OG_ATTEND_CUDA_QUANT_WIDEN ? d : OG_ATTEND_CUDA_QUANT_MMA);
    return prev;
}

extern "C" bool og_attend_cuda_decode_mma(og_dtype kv_dtype, int32_t head_dim) {
    const bool dt = kv_dtype == OG_DTYPE_BF16 ||
                    (og_kv_dtype_quantized(kv_dtype) && og_attend_cuda_get_quant_decode() != OG_ATTEND_CUDA_QUANT_SIMT);
    return dt && (head_dim == 64 || head_dim == 128);
}

/* True when a split-K step over storage of dt with heads of D runs on the tensor cores. */
static bool decode_on_mma(og_dtype dt, int32_t D) {
    return og_attend_cuda_get_decode() == OG_ATTEND_CUDA_MMA && og_attend_cuda_decode_mma(dt, D);
}

/* True when a step over storage of dt that runs on the tensor cores takes
 * qmma_attend_kernel (int8 / fp8, unless the widened-tile variant of
 * mma_attend_kernel is chosen). */
static bool qmma_serves(og_dtype dt) {
    return og_kv_dtype_quantized(dt) && og_attend_cuda_get_quant_decode() == OG_ATTEND_CUDA_QUANT_MMA;
}

/* Blocks of one split of one row: kv heads x head chunks. */
static int32_t row_blocks(int32_t n_heads, int32_t n_kv_heads) {
    const int32_t G = n_heads / n_kv_heads, gm = group_heads(G);
    return n_kv_heads * ((G + gm - 1) / gm);
}

extern "C" int32_t og_attend_cuda_max_splits(int32_t T, int32_t n_heads, int32_t n_kv_heads, int32_t sm_count) {
    if (T < 1 || n_kv_heads < 1 || n_heads < n_kv_heads || sm_count < 1) return 1;
    return split_cap(T, row_blocks(n_heads, n_kv_heads), sm_count);
}

extern "C" int64_t og_attend_cuda_scratch_floats(int32_t n_heads, int32_t head_dim) {
    return (int64_t)OG_ATTEND_CUDA_SPLIT_ROWS * n_heads * (head_dim + 3);
}

extern "C" bool og_attend_cuda_tiled(int32_t T, og_dtype kv_dtype, int32_t head_dim) {
    return T > 1 && kv_dtype == OG_DTYPE_BF16 && (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128);
}

extern "C" int32_t og_attend_cuda_splits(int64_t n, int32_t T, int32_t n_heads, int32_t n_kv_heads, int32_t sm_count) {
    int64_t chunk;
    return n < 1 ? 1
                 : splits_for(n, og_attend_cuda_max_splits(T, n_heads, n_kv_heads, sm_count),
                              og_attend_cuda_get_split_keys(), &chunk);
}

extern "C" og_status og_update_and_attend_cuda(void *stream, const og_attend_cuda_args *a) {
    const char *op = "update_and_attend_cuda";
    if (!a) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: args is NULL", op);
    const og_kv_layer_view *kv = &a->kv;
    if (!a->q || !a->k || !a->v || !a->out)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: q, k, v or out is NULL", op);
    if (!kv->k || !kv->v) return og_set_error(OG_ERR_UNBOUND, "%s: layer %d storage is unbound", op, kv->layer_id);
    if (a->T < 1 || a->n_heads < 1 || kv->n_kv_heads < 1 || a->n_heads % kv->n_kv_heads)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: T = %d, Hq = %d, Hkv = %d (need >= 1 and Hq %% Hkv == 0)", op,
                            a->T, a->n_heads, kv->n_kv_heads);
    const int32_t D = kv->head_dim;
    if (D < 8 || D > 256 || (D & (D - 1)))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d is not a power of two in [8, 256]", op, D);
    if (kv->dtype != OG_DTYPE_BF16 && kv->dtype != OG_DTYPE_F32 && !og_kv_dtype_quantized(kv->dtype))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: storage dtype %s (bf16, f32, int8 or fp8)", op,
                            og_dtype_name(kv->dtype));
    if (og_kv_dtype_quantized(kv->dtype) && D < 16) /* a tile row of D quants is at least one 16-byte piece */
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d over %s storage (need >= 16)", op, D,
                            og_dtype_name(kv->dtype));
    if (!isfinite(a->scale)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: scale is not finite", op);
    if (kv->length < 0) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: length %lld < 0", op, (long long)kv->length);
    if (kv->policy == OG_KV_FLAT) {
        if (kv->window != 0)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: flat layer %d with window %d", op, kv->layer_id,
                                kv->window);
        if (kv->length + a->T > kv->rows)
            return og_set_error(OG_ERR_CAPACITY, "%s: flat layer %d: %lld + %d tokens past %lld rows", op,
                                kv->layer_id, (long long)kv->length, a->T, (long long)kv->rows);
    } else if (kv->policy == OG_KV_RING) {
        if (kv->window < 1 || kv->rows < kv->window)
            return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: ring layer %d: window %d, %lld slots", op, kv->layer_id,
                                kv->window, (long long)kv->rows);
        if (a->T > kv->rows - kv->window + 1)
            return og_set_error(OG_ERR_WRITE_TOO_WIDE, "%s: ring layer %d: %d tokens, at most %lld per step", op,
                                kv->layer_id, a->T, (long long)(kv->rows - kv->window + 1));
    } else {
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: unknown policy %d", op, (int)kv->policy);
    }
    /* a row's own elements: Hkv * D, or Hkv * (D + 4) bytes quantized (quants, then scales) */
    const int64_t HD = og_kv_dtype_quantized(kv->dtype) ? og_kv_dtype_row_bytes(kv->dtype, kv->n_kv_heads, D)
                                                        : (int64_t)kv->n_kv_heads * D;
    const int64_t RS = kv->row_stride ? kv->row_stride : HD;
    if (RS < HD)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: layer %d: row stride %lld below a row's %lld", op,
                            kv->layer_id, (long long)RS, (long long)HD);
    if ((RS * (int64_t)og_dtype_size(kv->dtype)) % 16)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: layer %d: row stride %lld is not a multiple of 16 bytes",
                            op, kv->layer_id, (long long)RS);
    if (!aligned16(a->q) || !aligned16(a->k) || !aligned16(a->v) || !aligned16(a->out) || !aligned16(kv->k) ||
        !aligned16(kv->v) || !aligned16(a->partials))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is not 16-byte aligned", op);

    const bool tiled = og_attend_cuda_tiled(a->T, kv->dtype, D) && !a->split_k;
    if (a->out_bf16 && (!tiled || !aligned16(a->out_bf16)))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: out_bf16 needs the tiled kernel and 16-byte alignment", op);
    attend_params p;
    p.q = a->q, p.k = a->k, p.v = a->v, p.out = a->out;
    p.out16 = reinterpret_cast<__nv_bfloat16 *>(a->out_bf16);
    p.kc = kv->k, p.vc = kv->v;
    p.seqs = nullptr;
    p.RS = RS;
    const int64_t P = (int64_t)OG_ATTEND_CUDA_SPLIT_ROWS * a->n_heads;
    p.counters = reinterpret_cast<unsigned int *>(a->partials);
    p.part_acc = a->partials ? a->partials + P : NULL;
    p.part_m = a->partials ? a->partials + P * (D + 1) : NULL;
    p.part_l = a->partials ? a->partials + P * (D + 2) : NULL;
    p.length = a->length;
    p.L0 = kv->length, p.R = kv->rows;
    p.T = a->T, p.Hq = a->n_heads, p.Hkv = kv->n_kv_heads, p.D = D;
    p.G = a->n_heads / kv->n_kv_heads;
    p.lanes = D / kE;
    p.ring = kv->policy == OG_KV_RING;
    p.W = kv->window;
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);
    p.scale_log2 = scale * kLog2e;
    const int gm = group_heads(p.G);
    p.gm = gm;
    p.chunks = (p.G + gm - 1) / gm;
    if ((int64_t)p.Hkv * p.chunks > 65535)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: %d kv heads x %d head chunks exceed the grid", op, p.Hkv,
                            p.chunks);
    int dev = 0, sm_count = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return og_set_error(OG_ERR_BACKEND, "%s: SM count of the device: %s", op, cudaGetErrorString(e));
    const int32_t maxS = split_cap(a->T, p.Hkv * p.chunks, sm_count);
    if (maxS > 1 && !a->partials) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: partials scratch is NULL", op);
    p.max_splits = maxS;
    p.split_keys = og_attend_cuda_get_split_keys();

    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const bool bf16 = kv->dtype == OG_DTYPE_BF16;
    if (tiled) {
        if ((e = launch_kv_write(p, st)) != cudaSuccess) return launch_failed("kv_write", e);
        if ((e = launch_tiled(p, st, dev)) != cudaSuccess) return launch_failed("tiled attend", e);
        return OG_OK;
    }

    const dim3 grid((unsigned)a->T, (unsigned)(p.Hkv * p.chunks), (unsigned)maxS);
    if (decode_on_mma(kv->dtype, D)) {
        e = qmma_serves(kv->dtype) ? launch_qmma(p, kv->dtype, grid, st, dev, false)
                                   : launch_mma(p, kv->dtype, grid, st, dev, false);
        if (e != cudaSuccess) return launch_failed("attend (tensor cores)", e);
        return OG_OK;
    }
    switch (kv->dtype) {
    case OG_DTYPE_INT8: e = launch_attend<kv_i8, false>(p, gm, grid, st); break;
    case OG_DTYPE_FP8: e = launch_attend<kv_e4m3, false>(p, gm, grid, st); break;
    default:
        e = bf16 ? launch_attend<__nv_bfloat16, false>(p, gm, grid, st) : launch_attend<float, false>(p, gm, grid, st);
    }
    if (e != cudaSuccess) return launch_failed("attend", e);
    return OG_OK;
}

/* ---- batched decode ---- */

namespace {

/* The scratch bound holds for devices of up to this many SMs; a larger one
 * plans as if it had this many (still about a wave). */
constexpr int32_t kMaxSMs = 256;

/* A cap on the grid depth from the environment (OG_CUDA_ATTEND_BATCH_SPLITS,
 * for measurements; 0: none), read once. */
int32_t batch_split_env() {
    static const int32_t cap = [] {
        const char *v = getenv("OG_CUDA_ATTEND_BATCH_SPLITS");
        return v && atoi(v) > 0 ? (int32_t)atoi(v) : 0;
    }();
    return cap;
}

/* Grid depth of a batched call: splits of the longest entry there may be,
 * capped where B x row_blocks blocks per split already fill a wave. */
int32_t batch_split_cap(int32_t B, int32_t rb, int64_t max_keys, int32_t sm_count) {
    int64_t s = (max_keys + OG_ATTEND_CUDA_SPLIT_KEYS - 1) / OG_ATTEND_CUDA_SPLIT_KEYS;
    if (s > OG_ATTEND_CUDA_MAX_SPLITS) s = OG_ATTEND_CUDA_MAX_SPLITS;
    if (batch_split_env() > 0 && s > batch_split_env()) s = batch_split_env();
    const int64_t sms = sm_count < kMaxSMs ? sm_count : kMaxSMs;
    const int64_t per_split = (int64_t)B * rb;
    const int64_t fill = ((int64_t)kWave * sms + per_split - 1) / per_split;
    if (s > fill) s = fill;
    return s < 1 ? 1 : (int32_t)s;
}

/* Split counters at the head of the scratch, rounded to whole float4s. */
int64_t batch_counter_floats(int32_t B, int32_t n_heads) { return ((int64_t)B * n_heads + 3) / 4 * 4; }

} /* namespace */

extern "C" int32_t og_attend_batch_cuda_max_splits(int32_t B, int32_t n_heads, int32_t n_kv_heads, int64_t max_keys,
                                                   int32_t sm_count) {
    if (B < 1 || n_kv_heads < 1 || n_heads < n_kv_heads || sm_count < 1 || max_keys < 1) return 1;
    return batch_split_cap(B, row_blocks(n_heads, n_kv_heads), max_keys, sm_count);
}

extern "C" int64_t og_attend_batch_cuda_scratch_floats(int32_t B, int32_t n_heads, int32_t head_dim,
                                                       int64_t max_keys) {
    if (B < 1 || n_heads < 1 || head_dim < 1 || max_keys < 1) return 0;
    const int64_t S = batch_split_cap(B, 1, max_keys, kMaxSMs); /* row_blocks >= 1: the most any Hkv needs */
    return batch_counter_floats(B, n_heads) + (int64_t)B * S * n_heads * (head_dim + 2);
}

extern "C" og_status og_update_and_attend_batch_cuda(void *stream, const og_attend_batch_cuda_args *a) {
    const char *op = "update_and_attend_batch_cuda";
    if (!a) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: args is NULL", op);
    if (!a->q || !a->k || !a->v || !a->out || !a->seqs)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: q, k, v, out or seqs is NULL", op);
    if (a->B < 1 || a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: B = %d, Hq = %d, Hkv = %d (need >= 1 and Hq %% Hkv == 0)",
                            op, a->B, a->n_heads, a->n_kv_heads);
    const int32_t D = a->head_dim;
    if (D < 8 || D > 256 || (D & (D - 1)))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d is not a power of two in [8, 256]", op, D);
    if (a->kv_dtype != OG_DTYPE_BF16 && a->kv_dtype != OG_DTYPE_F32 && !og_kv_dtype_quantized(a->kv_dtype))
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: storage dtype %s (bf16, f32, int8 or fp8)", op,
                            og_dtype_name(a->kv_dtype));
    if (og_kv_dtype_quantized(a->kv_dtype) && D < 16)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: head dim %d over %s storage (need >= 16)", op, D,
                            og_dtype_name(a->kv_dtype));
    if (a->policy != OG_KV_FLAT && a->policy != OG_KV_RING)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: unknown policy %d", op, (int)a->policy);
    if (!isfinite(a->scale)) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: scale is not finite", op);
    if (a->max_keys < 1)
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: max_keys %lld < 1", op, (long long)a->max_keys);
    if (!aligned16(a->q) || !aligned16(a->k) || !aligned16(a->v) || !aligned16(a->out) || !aligned16(a->partials) ||
        ((uintptr_t)a->seqs & 7u))
        return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: a buffer is not aligned (16 bytes; seqs 8)", op);

    attend_params p = {};
    p.q = a->q, p.k = a->k, p.v = a->v, p.out = a->out;
    p.seqs = a->seqs;
    p.T = a->B, p.Hq = a->n_heads, p.Hkv = a->n_kv_heads, p.D = D;
    p.G = a->n_heads / a->n_kv_heads;
    p.lanes = D / kE;
    p.ring = a->policy == OG_KV_RING;
    const float scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)D);
    p.scale_log2 = scale * kLog2e;
    const int gm = group_heads(p.G);
    p.gm = gm;
    p.chunks = (p.G + gm - 1) / gm;
    if ((int64_t)p.Hkv * p.chunks > 65535)
        return og_set_error(OG_ERR_UNSUPPORTED, "%s: %d kv heads x %d head chunks exceed the grid", op, p.Hkv,
                            p.chunks);
    int dev = 0, sm_count = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return og_set_error(OG_ERR_BACKEND, "%s: SM count of the device: %s", op, cudaGetErrorString(e));
    const int32_t maxS = batch_split_cap(a->B, p.Hkv * p.chunks, a->max_keys, sm_count);
    if (maxS > 1 && !a->partials) return og_set_error(OG_ERR_INVALID_ARGUMENT, "%s: partials scratch is NULL", op);
    p.max_splits = maxS;
    p.split_keys = og_attend_cuda_get_split_keys();
    if (a->partials) {
        const int64_t C = batch_counter_floats(a->B, a->n_heads), P = (int64_t)a->B * maxS * a->n_heads;
        p.counters = reinterpret_cast<unsigned int *>(a->partials);
        p.part_acc = a->partials + C;
        p.part_m = a->partials + C + P * D;
        p.part_l = a->partials + C + P * (D + 1);
    }
    const dim3 grid((unsigned)a->B, (unsigned)(p.Hkv * p.chunks), (unsigned)maxS);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (decode_on_mma(a->kv_dtype, D)) {
        e = qmma_serves(a->kv_dtype) ? launch_qmma(p, a->kv_dtype, grid, st, dev, true)
                                     : launch_mma(p, a->kv_dtype, grid, st, dev, true);
    } else {
        switch (a->kv_dtype) {
        case OG_DTYPE_INT8: e = launch_attend<kv_i8, true>(p, gm, grid, st); break;
        case OG_DTYPE_FP8: e = launch_attend<kv_e4m3, true>(p, gm, grid, st); break;
        case OG_DTYPE_BF16: e = launch_attend<__nv_bfloat16, true>(p, gm, grid, st); break;
        default: e = launch_attend<float, true>(p, gm, grid, st);
        }
    }
    if (e != cudaSuccess) return og_set_error(OG_ERR_BACKEND, "%s: attend launch: %s (%s)", op, cudaGetErrorName(e),
                                              cudaGetErrorString(e));
    return OG_OK;
}
