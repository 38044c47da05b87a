/* update_and_attend on CUDA, split-K over int8 / fp8 storage on the tensor
 * cores (qmma_attend_kernel; D 64 or 128; the default for those formats,
 * OG_CUDA_ATTEND_QMMA=0 or og_attend_cuda_set_quant_decode select the
 * CUDA-core kernel of attend.cu): the split-K kernels' grid, splits,
 * partials, merge and storage write, with both products on mma.sync
 * m16n8k16 in f16 (f32 accumulation) and the quants dequantized in
 * registers, never widened in shared memory.
 *
 * Tiles of 64 keys (16 a warp) come through a 3-stage cp.async pipeline as
 * stored: D quant bytes a key for K and for V, and the keys' f32 k and v
 * scales (a stage is half the bytes of a bf16 one). The step's own keys are
 * quantized into the stage exactly as the row write quantizes them.
 *
 * Operands. int8 and e4m3 values are f16 values, converted exactly in
 * registers: int8 by the exponent trick (x + 128 as the low byte of the f16
 * 1024 + (x + 128), less 1152), e4m3 by cvt.f16x2.e4m3x2. f16 rather than
 * bf16: both conversions take one or two instructions a pair, and f16's 11
 * significant bits carry q and the weights in two parts (hi + lo) to about
 * 2^-22; its range is handled by scaling:
 * - S = Q K^T: q of a head is scaled by a power of two 2^e (exact) that
 *   brings its largest element into [2^14, 2^15), then split into hi =
 *   f16(x), lo = f16(x - hi): A rows g (hi) and g + 8 (lo) of head g (heads
 *   of a block of 4 or fewer: g mod 4, rows 4..7 repeat rows 0..3). The
 *   dot products of a lane's 4 contiguous quant bytes are taken as the mma's
 *   k columns 2i, 2i+1, 2i+8, 2i+9 of a step, and q's fragments follow the
 *   same order of d (a sum over d does not care which column holds which
 *   d), so a K operand is one 32-bit word of the tile, and a lane's 16-byte
 *   load covers 4 k steps. score = (hi + lo rows) x 2^-e x k scale: the
 *   k scale multiplies the score of its key.
 * - O += P V: the weight p = exp2(s - m) of a key times its v scale, over
 *   the largest v scale a warp has seen (vmax), times 2^15: w = p x vs /
 *   vmax x 2^15 <= 2^15 fits f16, and is split into hi + lo again. The
 *   accumulators hold O x 2^15 / vmax; when vmax grows they are rescaled
 *   with the softmax's own rescale, and multiplied by vmax x 2^-15 at the
 *   end. The row sums take p alone. Heads of a block of 4 or fewer: lanes of
 *   A rows 0..3 carry hi, rows 4..7 lo (rows 8..15 zero), so P V takes one
 *   mma per 8 output columns and no additions; the two halves are added by
 *   one shuffle at the end. 8 heads: rows g hi, g + 8 lo, added per mma.
 *   V's k dimension is keys, so a B operand pairs one byte of two keys
 *   (a byte permute of two rows' words, then the conversion); a lane loads
 *   D / 8 contiguous bytes of 4 key rows, and its 8-column n tiles are the
 *   columns 16 g + c (D 128) of those bytes.
 * Tiles are swizzled by 16-byte chunks so that the K and V loads of a warp
 * meet no bank conflict at D 128 (at D 64 the V loads of 4 rows of one
 * parity fall in one half of the banks: 2-way).
 * Launched after the kernel before it has finished (no programmatic
 * dependent launch). With it, the copies of stored keys started before
 * grid_wait raced a call of the same layer just before (back-to-back calls
 * on one storage): test_attend_cuda saw NaN in 3 of 80,588 cases (fp8,
 * batched) and in 1 bf16 prefill case on an H200, and every case passed
 * once the launch waited. The kernel still reads its table entry and starts
 * those copies before its grid_wait, which then returns at once; the early
 * start could come back for rows no kernel in flight can write.
 * Precision: the test's bound (tests/test_attend_cuda.c, kQmmaAtol) is
 * derived from the roundings above.
 * Letters and shared pieces: attend_common.cuh.
 */
#include "kernels/cuda/attend_common.cuh"
#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>

#include <type_traits>

namespace og_attend {

namespace {

constexpr int kQWarps = kThreads / 32;
constexpr int kQKeys = 64;   /* keys of a tile: 16 a warp */
constexpr int kQStages = 3;  /* tiles in flight: two ahead of the one used */
constexpr float kWScale = 32768.0f; /* 2^15: the largest weight of P V in f16 */

/* Byte offsets of a block's shared memory. */
template <int D>
struct qmma_smem {
    static constexpr int tile = kQKeys * D;                   /* quant bytes of a K (V) tile */
    static constexpr int scales = 2 * tile;                   /* [K, V][kQKeys] f32, past the quants */
    static constexpr int stage = scales + 2 * kQKeys * 4;
    static constexpr int q = kQStages * stage;                /* q fragments: [D / 16 k steps][32 lanes] x 16 bytes */
    static constexpr int qinv = q + (D / 16) * 32 * 16;       /* [8] f32: 2^-e of each head's q */
    static constexpr int total = qinv + 8 * 4;
    static_assert(stage % 16 == 0 && q % 16 == 0, "16-byte aligned pieces");
    /* the merge after the tiles: [4, 8] maxima and sums, [4, 8, D] accumulators */
    static_assert(total >= (2 * kQWarps * 8 + kQWarps * 8 * D) * 4, "the merge fits");
    static_assert(total >= 2 * 8 * OG_ATTEND_CUDA_MAX_SPLITS * 4, "the split merge fits");
};

/* Byte offset of 16-byte chunk ch of key row r in a tile of D bytes a row:
 * chunks XORed with bits of r so that the loads of qmma_attend_kernel read
 * 8 (D 128) different chunks of each 128-byte bank line. */
template <int D>
__device__ inline int qswz(int r, int ch) {
    if constexpr (D == 128) return r * D + ((ch ^ ((((r >> 1) & 3) << 1) ^ ((r & 1) << 2))) << 4);
    else return r * D + ((ch ^ ((r >> 1) & 3)) << 4);
}

/* The f16 pairs of bytes 0, 1 (lo: byte 0 in its low half) and 2, 3 (hi) of
 * w, exact. int8: x + 128 as the low byte of f16 0x64xx is 1024 + x + 128. */
__device__ inline void f16_pairs(kv_i8, uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t u = w ^ 0x80808080u;
    const uint32_t a = __byte_perm(u, 0x64646464u, 0x4140), b = __byte_perm(u, 0x64646464u, 0x4342);
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)); /* 1152 */
    const __half2 x = __hsub2(*reinterpret_cast<const __half2 *>(&a), bias);
    const __half2 y = __hsub2(*reinterpret_cast<const __half2 *>(&b), bias);
    lo = *reinterpret_cast<const uint32_t *>(&x);
    hi = *reinterpret_cast<const uint32_t *>(&y);
}
__device__ inline void f16_pairs(kv_e4m3, uint32_t w, uint32_t &lo, uint32_t &hi) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
    lo = (uint32_t)a.x | (uint32_t)a.y << 16;
    hi = (uint32_t)b.x | (uint32_t)b.y << 16;
}

__device__ inline uint32_t word_of(const uint4 &v, int u) { return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w; }
__device__ inline uint32_t word_of(const uint2 &v, int u) { return u == 0 ? v.x : v.y; }

/* f16 hi = f16(a, b) and lo = f16 of what hi leaves (a - hi is exact in f32). */
__device__ inline void split_f16(float a, float b, uint32_t &hi, uint32_t &lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* c += a b: m16n8k16, f16 operands, f32 accumulators (fragments as mma_bf16). */
__device__ inline void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Rows g of c += a b (c0, c1); rows g + 8 of a b alone go to d2, d3. */
__device__ inline void mma_f16_top(float (&c)[2], float &d2, float &d3, const uint32_t (&a)[4], uint32_t b0,
                                   uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%10,%10};\n"
                 : "+f"(c[0]), "+f"(c[1]), "=f"(d2), "=f"(d3)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

/* Starts filling a stage with keys k0 + jr .. k0 + jr + 63: stored keys by
 * cp.async (quants and scales), the step's keys (only when STEP) quantized
 * here as the row write quantizes them (a warp a key: amax by shuffles, the
 * same f32 division and conversions), keys past the split as zeros. */
template <typename KV, int D, bool STEP>
__device__ inline void qtile_load(const mma_keys &q, int32_t jr, unsigned char *stg) {
    using QS = qmma_smem<D>;
    constexpr int CH = D / 16;                 /* 16-byte chunks of a row of quants */
    constexpr int RSTEP = kThreads / CH;       /* a thread's chunks: rows r0, r0 + RSTEP, ..., chunk ch */
    constexpr int NP = kQKeys * CH / kThreads; /* 4 (D 128), 2 (D 64) */
    unsigned char *kt = stg, *vt = stg + QS::tile;
    float *ksc = reinterpret_cast<float *>(stg + QS::scales), *vsc = ksc + kQKeys;
    const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
    int64_t first = q.k0 + jr; /* the slot of row 0; row r's is first + r, less R once past it */
    if (q.ring) first %= q.R;
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const int r = r0 + i * RSTEP;
        const int32_t j = jr + r;
        if (j < q.n_stored || j >= q.n) { /* a stored key, or zeros */
            const bool ok = j < q.n;
            int64_t slot = first + r;
            if (q.ring && slot >= q.R) slot -= q.R;
            const int64_t off = (ok ? slot * q.row_bytes : 0) + ch * 16;
            const int o = qswz<D>(r, ch);
            copy16_async(kt + o, q.kb + off, ok);
            copy16_async(vt + o, q.vb + off, ok);
        }
    }
    if (threadIdx.x < kQKeys) { /* the scales: a key a thread */
        const int r = threadIdx.x;
        const int32_t j = jr + r;
        if (j < q.n_stored || j >= q.n) {
            const bool ok = j < q.n;
            int64_t slot = first + r;
            if (q.ring && slot >= q.R) slot -= q.R;
            const int64_t off = ok ? slot * q.row_bytes + q.scale_rel : 0;
            copy4_async(ksc + r, q.kb + off, ok);
            copy4_async(vsc + r, q.vb + off, ok);
        }
    }
    if (STEP && jr + kQKeys > q.n_stored && q.n_stored < q.n) { /* the same for every thread */
        constexpr int PER = D / 32;                                 /* elements a lane: 4 or 2 */
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const int r_lo = q.n_stored > jr ? q.n_stored - jr : 0, r_hi = q.n - jr < kQKeys ? q.n - jr : kQKeys;
        for (int r = r_lo + warp; r < r_hi; r += kQWarps) {
            const int64_t at = (int64_t)(jr + r - q.n_stored) * q.row + lane * PER;
            float kf[PER], vf[PER], ka = 0.0f, va = 0.0f;
#pragma unroll
            for (int e = 0; e < PER; e++) {
                kf[e] = q.knew[at + e], vf[e] = q.vnew[at + e];
                ka = fmaxf(ka, fabsf(kf[e])), va = fmaxf(va, fabsf(vf[e]));
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                ka = fmaxf(ka, __shfl_xor_sync(0xffffffffu, ka, o));
                va = fmaxf(va, __shfl_xor_sync(0xffffffffu, va, o));
            }
            const float kscale = ka / quant_max(KV{}), vscale = va / quant_max(KV{});
            const int b = lane * PER; /* the lane's first byte of the row */
            KV *kd = reinterpret_cast<KV *>(kt + qswz<D>(r, b >> 4) + (b & 15));
            KV *vd = reinterpret_cast<KV *>(vt + qswz<D>(r, b >> 4) + (b & 15));
#pragma unroll
            for (int e = 0; e < PER; e++) {
                store_quant(kd + e, kf[e], kscale);
                store_quant(vd + e, vf[e], vscale);
            }
            if (lane == 0) ksc[r] = kscale, vsc[r] = vscale;
        }
    }
}

/* GM8: a block serves 8 query heads (A rows g hi, g + 8 lo, P V halves
 * added per mma), else 4 or fewer (see the header). BATCH: blockIdx.x is an
 * entry of the table p.seqs, else a token of one session. */
template <typename KV, int D, bool GM8, bool BATCH>
__global__ void __launch_bounds__(kThreads, kWave) qmma_attend_kernel(attend_params p) {
    using QS = qmma_smem<D>;
    constexpr int KC = D / 16; /* k steps of q . k */
    constexpr int ND = D / 8;  /* n tiles of O: a lane's columns */
    constexpr int KH = D / 64; /* 16-byte K chunks of a key a lane reads */
    static_assert(D == 64 || D == 128, "tile geometry");
    const int32_t hk = blockIdx.y / p.chunks, chunk_i = blockIdx.y % p.chunks;
    const int32_t h0 = hk * p.G + chunk_i * p.gm;
    const int32_t g_n = min(p.gm, p.G - chunk_i * p.gm);
    const int32_t t = blockIdx.x;
    row_geom rg;
    const row_status rs = block_row_status<KV, BATCH>(p, t, rg);
    if (rs == kRowBad) {
        og_cuda::grid_wait(); /* out may still be read by the kernel before */
        poison_rows(p, t, h0, g_n);
    }
    if (rs != kRowGo) return;
    const int64_t L = rg.L, pos = rg.pos;
    const int64_t lo = first_key(p.ring, rg.W, pos);
    int64_t chunk;
    const int32_t S = splits_for(pos - lo + 1, p.max_splits, p.split_keys, &chunk);
    const int32_t split = blockIdx.z;
    if (split >= S) return; /* the whole block leaves: no barrier is skipped */
    const int64_t k0 = lo + split * chunk;
    const int64_t k1 = min(k0 + chunk, pos + 1); /* k0 < k1: no split is empty */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, ti = lane & 3;
    const int gq = GM8 ? gr : gr & 3; /* the head of this lane's rows */

    extern __shared__ __align__(16) unsigned char smem[];

    mma_keys ks;
    {
        const int64_t row = (int64_t)p.Hkv * D; /* floats between rows of k, v */
        const int64_t row0 = t - (pos - L);     /* the row of k, v holding position L */
        ks.kb = rg.st.k + (int64_t)hk * D, ks.vb = rg.st.v + (int64_t)hk * D;
        ks.knew = p.k + row0 * row + (int64_t)hk * D, ks.vnew = p.v + row0 * row + (int64_t)hk * D;
        ks.k0 = k0;
        ks.row_bytes = rg.st.RS;
        ks.scale_rel = (int32_t)((int64_t)p.Hkv * D + (int64_t)hk * OG_KV_SCALE_BYTES - (int64_t)hk * D);
        ks.R = rg.st.R;
        ks.n = (int32_t)(k1 - k0);
        ks.n_stored = (int32_t)(L <= k0 ? 0 : L >= k1 ? k1 - k0 : L - k0);
        ks.row = (int32_t)row;
        ks.ring = p.ring;
        if (k0 > L) ks.knew += (k0 - L) * row, ks.vnew += (k0 - L) * row;
    }
    const int32_t n_tiles = (ks.n + kQKeys - 1) / kQKeys;
    __shared__ mma_keys ks_s; /* what the loads of later tiles read, rather than 19 registers */
    if (threadIdx.x == 0) ks_s = ks;

    /* the first stages: before the wait when they hold stored keys alone
     * (the storage rows before L were written by earlier steps) */
    const bool early = ks.n_stored >= min(ks.n, (kQStages - 1) * kQKeys);
    if (early) {
#pragma unroll
        for (int i = 0; i < kQStages - 1; i++) {
            if (i < n_tiles) qtile_load<KV, D, false>(ks, i * kQKeys, smem + i * QS::stage);
            copies_commit();
        }
    }
    og_cuda::grid_wait(); /* q, k, v (and the scratch) of the kernels before are ready */
    if (!early) {
#pragma unroll
        for (int i = 0; i < kQStages - 1; i++) {
            if (i < n_tiles) qtile_load<KV, D, true>(ks, i * kQKeys, smem + i * QS::stage);
            copies_commit();
        }
    }

    /* q fragments (warp 0; read after the barrier that opens the first tile):
     * for k step c = 4h + u and lane (gr, ti), a0 / a2 = hi of d0, d0 + 1 /
     * d0 + 2, d0 + 3 and a1 / a3 = their lo, d0 = 64h + 16ti + 4u; 2^-e per head */
    float *qinv_s = reinterpret_cast<float *>(smem + QS::qinv);
    if (warp == 0) {
        const bool live = gq < g_n;
        const float *qp = p.q + ((int64_t)t * p.Hq + h0 + (live ? gq : 0)) * D;
        float amax = 0.0f; /* of the head's pre-scaled q (a lane's elements, then its 4 lanes) */
#pragma unroll
        for (int c = 0; c < KC; c++) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (live) v = *reinterpret_cast<const float4 *>(qp + 64 * (c >> 2) + 16 * ti + 4 * (c & 3));
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x * p.scale_log2), fabsf(v.y * p.scale_log2)),
                                     fmaxf(fabsf(v.z * p.scale_log2), fabsf(v.w * p.scale_log2))));
        }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        int e2 = 0; /* amax x 2^e2 in [2^14, 2^15) */
        if (amax > 0.0f && amax <= 3.4e38f) e2 = 14 - ilogbf(amax);
        e2 = max(-100, min(100, e2));
        const float up = __int_as_float((127 + e2) << 23), down = __int_as_float((127 - e2) << 23);
#pragma unroll
        for (int c = 0; c < KC; c++) { /* q again (L1): hi + lo of (q x scale log2 e) x 2^e2, exact scaling */
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (live) v = *reinterpret_cast<const float4 *>(qp + 64 * (c >> 2) + 16 * ti + 4 * (c & 3));
            uint32_t h01, l01, h23, l23;
            split_f16(v.x * p.scale_log2 * up, v.y * p.scale_log2 * up, h01, l01);
            split_f16(v.z * p.scale_log2 * up, v.w * p.scale_log2 * up, h23, l23);
            *reinterpret_cast<uint4 *>(smem + QS::q + (c * 32 + lane) * 16) = make_uint4(h01, l01, h23, l23);
        }
        if (ti == 0 && (GM8 || gr < 4)) qinv_s[gq] = down;
    }

    float o[ND][2]; /* O x 2^15 / vmax of head gq (hi or lo part), columns 2 ND ti + c, + ND */
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = 0.0f;
    float m = -INFINITY, l = 0.0f, vmax = 0.0f; /* m, vmax: the same across the warp's lanes of a head */

    for (int32_t i = 0; i < n_tiles; i++) {
        copies_wait<kQStages - 2>(); /* this thread's pieces of tile i are in */
        __syncthreads();             /* everyone's are (and their plain stores), and tile i - 1 is consumed */
        const int32_t next = i + kQStages - 1;
        if (next < n_tiles) qtile_load<KV, D, true>(ks_s, next * kQKeys, smem + (next % kQStages) * QS::stage);
        copies_commit();
        const unsigned char *stg = smem + (i % kQStages) * QS::stage;
        const int rw = warp * 16;                    /* this warp's first row in the tile */
        const int32_t live = ks.n - i * kQKeys - rw; /* keys of its rows inside the split */
        if (live <= 0) continue;                     /* the same for the whole warp; no barrier follows */

        /* S = Q K^T: s[j] = rows gr (hi), gr + 8 (lo) x keys rw + 8j + 2ti (+1) */
        uint4 kr[2][KH];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int h = 0; h < KH; h++)
                kr[j][h] = *reinterpret_cast<const uint4 *>(stg + qswz<D>(rw + 8 * j + gr, 4 * h + ti));
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int c = 0; c < KC; c++) {
            const uint4 qa = *reinterpret_cast<const uint4 *>(smem + QS::q + (c * 32 + lane) * 16);
            const uint32_t a[4] = {qa.x, qa.y, qa.z, qa.w};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint32_t b0, b1;
                f16_pairs(KV{}, word_of(kr[j][c >> 2], c & 3), b0, b1);
                mma_f16(s[j], a, b0, b1);
            }
        }
        /* scores of head gq (hi + lo rows) x 2^-e x k scale, -inf past the split; online softmax */
        const float *ksc = reinterpret_cast<const float *>(stg + QS::scales) + rw + 2 * ti;
        const float *vsc = ksc + kQKeys;
        const float2 kv2[2] = {*reinterpret_cast<const float2 *>(ksc), *reinterpret_cast<const float2 *>(ksc + 8)};
        const float2 vv2[2] = {*reinterpret_cast<const float2 *>(vsc), *reinterpret_cast<const float2 *>(vsc + 8)};
        const float qinv = qinv_s[gq];
        float x[2][2], mx = -INFINITY, vt = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float sc = (e ? kv2[j].y : kv2[j].x) * qinv;
                const float y = (s[j][e] + s[j][2 + e]) * sc;
                x[j][e] = 8 * j + 2 * ti + e < live ? y : -INFINITY;
                mx = fmaxf(mx, x[j][e]);
                vt = fmaxf(vt, e ? vv2[j].y : vv2[j].x); /* keys past the split: zeros */
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        vt = fmaxf(vt, __shfl_xor_sync(0xffffffffu, vt, 1));
        vt = fmaxf(vt, __shfl_xor_sync(0xffffffffu, vt, 2));
        const float mn = fmaxf(m, mx);
        const float base = mn == -INFINITY ? 0.0f : mn; /* no key yet: every weight is exp2(-inf) = 0 */
        const float cr = exp2f(m - base);
        m = mn;
        const float vn = fmaxf(vmax, vt);
        const float ratio = vn > 0.0f ? vmax / vn : 1.0f; /* vmax 0: O is 0 */
        const float winv = vn > 0.0f ? kWScale / vn : 0.0f;
        vmax = vn;
        const float f = cr * ratio;
        if (__any_sync(0xffffffffu, f != 1.0f)) {
#pragma unroll
            for (int n = 0; n < ND; n++) o[n][0] *= f, o[n][1] *= f;
        }
        l *= cr;
        float w[2][2];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float pe = exp2f(x[j][e] - base);
                l += pe;
                w[j][e] = pe * ((e ? vv2[j].y : vv2[j].x) * winv);
            }
        /* V rows rw + 2ti, + 1, + 8, + 9: D / 8 bytes at column (D / 8) gr,  */
        using VT = typename std::conditional<D == 128, uint4, uint2>::type;
        VT vr[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = rw + 2 * ti + (r & 1) + 8 * (r >> 1);
            const unsigned char *vt = stg + QS::tile;
            if constexpr (D == 128) vr[r] = *reinterpret_cast<const VT *>(vt + qswz<D>(row, gr));
            else vr[r] = *reinterpret_cast<const VT *>(vt + qswz<D>(row, gr >> 1) + (gr & 1) * 8);
        }

        /* P's A fragment: keys 2ti, 2ti + 1 (a0, a1) and 8 + 2ti, + 1 (a2, a3) of rows gr, gr + 8 */
        uint32_t h0w, l0w, h1w, l1w;
        split_f16(w[0][0], w[0][1], h0w, l0w);
        split_f16(w[1][0], w[1][1], h1w, l1w);
        uint32_t a[4];
        if constexpr (GM8) {
            a[0] = h0w, a[1] = l0w, a[2] = h1w, a[3] = l1w;
        } else {
            a[0] = gr < 4 ? h0w : l0w, a[2] = gr < 4 ? h1w : l1w;
            a[1] = a[3] = 0u;
        }
        /* O += P V: n tile c of word wd is column (D / 8) gr + 4 wd + c; b0 pairs keys 2ti, 2ti + 1
         * (rows 0, 1 of vr), b1 keys 2ti + 8, + 9 (rows 2, 3) */
#pragma unroll
        for (int wd = 0; wd < D / 32; wd++) {
            uint32_t b0[4], b1[4];
            const uint32_t r0 = word_of(vr[0], wd), r1 = word_of(vr[1], wd);
            const uint32_t r2 = word_of(vr[2], wd), r3 = word_of(vr[3], wd);
            f16_pairs(KV{}, __byte_perm(r0, r1, 0x5140), b0[0], b0[1]);
            f16_pairs(KV{}, __byte_perm(r0, r1, 0x7362), b0[2], b0[3]);
            f16_pairs(KV{}, __byte_perm(r2, r3, 0x5140), b1[0], b1[1]);
            f16_pairs(KV{}, __byte_perm(r2, r3, 0x7362), b1[2], b1[3]);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float d2, d3;
                mma_f16_top(o[4 * wd + c], d2, d3, a, b0[c], b1[c]);
                if constexpr (GM8) o[4 * wd + c][0] += d2, o[4 * wd + c][1] += d3;
            }
        }
    }
    copies_wait<0>();

    if (split == S - 1 && chunk_i == 0) {
        row_geom wg; /* read again rather than held in registers through the tiles */
        block_row_status<KV, BATCH>(p, t, wg);
        write_own_row<KV>(p, wg.st, wg.pos, t, hk);
    }

    /* the 4 warps' partials to shared memory (the tiles are consumed), as
     * finish_split reads them: [4, 8] maxima, [4, 8] sums, [4, 8, D] accumulators */
    __syncthreads();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if constexpr (!GM8) { /* rows 4..7 held the lo halves of heads 0..3 */
#pragma unroll
        for (int n = 0; n < ND; n++) {
            o[n][0] += __shfl_xor_sync(0xffffffffu, o[n][0], 16);
            o[n][1] += __shfl_xor_sync(0xffffffffu, o[n][1], 16);
        }
    }
    float *sm = reinterpret_cast<float *>(smem);
    float *sm_m = sm, *sm_l = sm + kQWarps * 8, *sm_acc = sm + 2 * kQWarps * 8;
    if (GM8 || gr < 4) {
        if (ti == 0) {
            sm_m[warp * 8 + gr] = m;
            sm_l[warp * 8 + gr] = l;
        }
        const float sc = vmax * (1.0f / kWScale);
        float *dst = sm_acc + (warp * 8 + gr) * D + 2 * ND * ti;
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int c4 = 0; c4 < ND / 4; c4++)
                *reinterpret_cast<float4 *>(dst + e * ND + 4 * c4) =
                    make_float4(o[4 * c4][e] * sc, o[4 * c4 + 1][e] * sc, o[4 * c4 + 2][e] * sc, o[4 * c4 + 3][e] * sc);
    }
    __syncthreads();
    finish_split<8>(p, sm, kQWarps, g_n, h0, t, S, split);
}

template <typename KV, int D, bool GM8, bool BATCH>
cudaError_t launch_qmma_d(const attend_params &p, dim3 grid, cudaStream_t st, int dev) {
    constexpr int smem = qmma_smem<D>::total;
    static std::atomic<unsigned long long> done{0};
    const cudaError_t e = allow_smem(qmma_attend_kernel<KV, D, GM8, BATCH>, smem, dev, done);
    if (e != cudaSuccess) return e;
    /* no programmatic dependent launch (see the header) */
    og_cuda::launch_after_smem(qmma_attend_kernel<KV, D, GM8, BATCH>, grid, dim3(kThreads), smem, st, p);
    return cudaGetLastError();
}

template <typename KV, bool BATCH>
cudaError_t launch_qmma_kv(const attend_params &p, dim3 grid, cudaStream_t st, int dev) {
    if (p.gm == 8)
        return p.D == 64 ? launch_qmma_d<KV, 64, true, BATCH>(p, grid, st, dev)
                         : launch_qmma_d<KV, 128, true, BATCH>(p, grid, st, dev);
    return p.D == 64 ? launch_qmma_d<KV, 64, false, BATCH>(p, grid, st, dev)
                     : launch_qmma_d<KV, 128, false, BATCH>(p, grid, st, dev);
}

} /* namespace */

cudaError_t launch_qmma(const attend_params &p, og_dtype dt, dim3 grid, cudaStream_t st, int dev, bool batch) {
    if (dt == OG_DTYPE_INT8)
        return batch ? launch_qmma_kv<kv_i8, true>(p, grid, st, dev) : launch_qmma_kv<kv_i8, false>(p, grid, st, dev);
    return batch ? launch_qmma_kv<kv_e4m3, true>(p, grid, st, dev) : launch_qmma_kv<kv_e4m3, false>(p, grid, st, dev);
}

} /* namespace og_attend */
