/* update_and_attend on CUDA, split-K decode on the tensor cores
 * (mma_attend_kernel; bf16 storage, D 64 or 128; the default, OG_CUDA_ATTEND=simt
 * or og_attend_cuda_set_decode select the CUDA-core kernel of attend.cu
 * instead): the split-K kernel's grid, splits, partials, merge and storage
 * write, with a block's gm <= 8 query heads as the M rows of mma.sync: row g
 * holds head g's q as bf16 hi, row g + 8 its bf16 lo, so one m16n8k16 gives
 * both halves of every score; the 4 warps each take a quarter of every
 * tile's keys (ldmatrix from a swizzled tile), and P V runs per 8 keys with
 * m16n8k8, P's rows g and g + 8 again hi and lo. q and p both keep ~2^-16
 * of their precision. The step's own keys are written into the tiles
 * (rounded to bf16 as stored), so every key takes the same path. int8 /
 * fp8 storage (OG_CUDA_ATTEND_QMMA=widen; attend_qmma.cu is the default): stages of quants and scales (half
 * the bytes of a bf16 stage), widened to bf16 tiles after each tile's
 * barrier (the quants are bf16 values), scales folded into score and weight
 * as the CUDA-core kernel folds them.
 * Launched after the kernel before it has finished (no programmatic
 * dependent launch). With it, the copies of stored keys started before
 * grid_wait raced a call of the same layer just before (back-to-back calls
 * on one storage): test_attend_cuda saw NaN in 3 of 80,588 cases (fp8,
 * batched) and in 1 bf16 prefill case on an H200, and every case passed
 * once the launch waited. The kernel still reads its table entry and starts
 * those copies before its grid_wait, which then returns at once; the early
 * start could come back for rows no kernel in flight can write.
 * Letters and shared pieces: attend_common.cuh.
 */
#include "kernels/cuda/attend_common.cuh"
#include "kernels/cuda/common.cuh"

namespace og_attend {

namespace {

/* ---- the split-K kernel on the tensor cores (decode over bf16 storage, D 64 / 128) ---- */

constexpr int kMmaWarps = kThreads / 32;

/* d = a b for a 16x8 bf16 (row), b 8x8 bf16 (col), then c += rows g and
 * g + 8 of d (one head: the products of its hi and lo weights). Fragments
 * of lane (g = lane / 4, i = lane % 4): a = rows g (a0), g+8 (a1) x cols
 * 2i, 2i+1; b = rows 2i, 2i+1 x col g; c = cols 2i, 2i+1 of the sum. The
 * rows g + 8 pass through registers that die at once (not 2 more
 * accumulators per 8 columns). */
__device__ inline void mma_bf16_k8_fold(float (&c)[2], uint32_t a0, uint32_t a1, uint32_t b) {
    float d2, d3;
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%7,%7};\n"
                 : "+f"(c[0]), "+f"(c[1]), "=f"(d2), "=f"(d3)
                 : "r"(a0), "r"(a1), "r"(b), "f"(0.0f));
    c[0] += d2;
    c[1] += d3;
}

/* Byte offset in a tile ([KT keys, D] bf16, rows 2D bytes) of 16-byte chunk
 * ch of key row r. The chunks of a row are permuted by r mod 8, so the same
 * chunk of 8 consecutive rows lies in 8 different groups of 4 banks (D of 64
 * or more: 8 or more chunks a row): ldmatrix reads and cp.async writes
 * without bank conflicts. */
template <int D>
__device__ inline int swizzled(int r, int ch) {
    return r * (2 * D) + ((ch ^ (r & 7)) << 4);
}

/* Starts filling a K and a V tile with keys k0 + jr .. k0 + jr + KT - 1:
 * stored keys by cp.async from storage, keys of this step from k, v rounded
 * to bf16 as the storage write rounds them (plain stores: the barrier before
 * the tile is read orders them), keys past the split as zeros. */
template <int D>
__device__ inline void mma_tile_load(const mma_keys &q, int32_t jr, unsigned char *kt, unsigned char *vt) {
    constexpr int CH = D / 8;                  /* 16-byte chunks of a key row */
    constexpr int KT = kTileBytes / (2 * D);
    constexpr int RSTEP = kThreads / CH;       /* a thread's pieces: rows r0, r0 + RSTEP, ..., chunk ch */
    const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
    /* the slot of tile row 0; row r's is first + r, less R once past it (a
     * split's keys lie in one window: fewer than R) */
    int64_t first = q.k0 + jr;
    if (q.ring) first %= q.R;
#pragma unroll
    for (int i = 0; i < kPieces; i++) {
        const int r = r0 + i * RSTEP;
        const int32_t j = jr + r;
        if (j < q.n_stored || j >= q.n) { /* a stored key, or zeros */
            const bool ok = j < q.n;
            int64_t slot = first + r;
            if (q.ring && slot >= q.R) slot -= q.R;
            const int64_t off = (ok ? slot * q.row_bytes : 0) + ch * 16;
            const int o = swizzled<D>(r, ch);
            copy16_async(kt + o, q.kb + off, ok);
            copy16_async(vt + o, q.vb + off, ok);
        }
    }
    if (jr + KT > q.n_stored && q.n_stored < q.n) { /* the tile holds keys of this step (the same for every thread) */
#pragma unroll 1
        for (int i = 0; i < kPieces; i++) {
            const int r = r0 + i * RSTEP;
            const int32_t j = jr + r;
            if (j < q.n_stored || j >= q.n) continue;
            const int64_t at = (int64_t)(j - q.n_stored) * q.row + ch * kE;
            float kf[kE], vf[kE];
            load8(q.knew + at, kf);
            load8(q.vnew + at, vf);
            const int o = swizzled<D>(r, ch);
            *reinterpret_cast<uint4 *>(kt + o) = make_uint4(pack_bf16(kf[0], kf[1]), pack_bf16(kf[2], kf[3]),
                                                            pack_bf16(kf[4], kf[5]), pack_bf16(kf[6], kf[7]));
            *reinterpret_cast<uint4 *>(vt + o) = make_uint4(pack_bf16(vf[0], vf[1]), pack_bf16(vf[2], vf[3]),
                                                            pack_bf16(vf[4], vf[5]), pack_bf16(vf[6], vf[7]));
        }
    }
}

/* int8 / fp8 storage on the tensor cores. A stage holds the tile's quants
 * as stored ([KT, D] bytes for K and for V: the keys of a bf16 tile, half
 * the bytes) and their f32 k and v scales ([KT] each); after the barrier
 * that opens a tile its quants are widened to bf16 (exact: int8 and e4m3
 * values are bf16 values) into one K and one V tile laid out as the bf16
 * kernel's, which the same ldmatrix / mma code reads. The scales are folded
 * in as the CUDA-core kernel folds them: score = (q . quants) x k scale,
 * weight = p x v scale. Byte offsets of shared memory: */
template <int D>
struct mma_quant_smem {
    static constexpr int KT = kTileBytes / (2 * D);             /* keys of a tile */
    static constexpr int tile = KT * D;                          /* quant bytes of a K (V) tile: 4 KB */
    static constexpr int scales = 2 * kStages * tile;            /* [stage][K, V][KT] f32 */
    static constexpr int wide = scales + 2 * kStages * KT * 4;   /* the bf16 K tile, then the V tile */
    static constexpr int q = wide + 2 * kTileBytes;              /* the q tile (D 128) */
    static constexpr int total = q + (D > 64 ? 16 * D * 2 : 0);
    static_assert(wide % 16 == 0 && total <= 48 * 1024, "quantized tiles fit the default shared memory");
};

/* Starts filling stage (kt, vt: quants; ksc, vsc: scales) with keys k0 + jr
 * .. k0 + jr + KT - 1: stored keys by cp.async (quants and scales), keys of
 * this step quantized here exactly as the row write quantizes them (amax of
 * the head over a warp, f32 division, the same conversions), keys past the
 * split as zeros. */
template <typename KV, int D>
__device__ inline void mma_quant_tile_load(const mma_keys &q, int32_t jr, unsigned char *kt, unsigned char *vt,
                                           float *ksc, float *vsc) {
    constexpr int CH = D / 16;            /* 16-byte pieces of a row of quants */
    constexpr int KT = kTileBytes / (2 * D);
    constexpr int RSTEP = kThreads / CH;  /* a thread's pieces: rows r0, r0 + RSTEP, piece ch */
    constexpr int NP = KT * CH / kThreads; /* 2 */
    const int ch = threadIdx.x % CH, r0 = threadIdx.x / CH;
    int64_t first = q.k0 + jr;
    if (q.ring) first %= q.R;
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const int r = r0 + i * RSTEP;
        const int32_t j = jr + r;
        if (j < q.n_stored || j >= q.n) {
            const bool ok = j < q.n;
            int64_t slot = first + r;
            if (q.ring && slot >= q.R) slot -= q.R;
            const int64_t off = (ok ? slot * q.row_bytes : 0) + ch * 16;
            copy16_async(kt + r * D + ch * 16, q.kb + off, ok);
            copy16_async(vt + r * D + ch * 16, q.vb + off, ok);
        }
    }
    if (threadIdx.x < KT) { /* the scales: one key a thread */
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
    if (jr + KT > q.n_stored && q.n_stored < q.n) { /* keys of this step: a warp a key (the same for every thread) */
        constexpr int PER = D / 32;                  /* elements a lane: 4 or 2 */
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        const int r_lo = q.n_stored > jr ? q.n_stored - jr : 0, r_hi = q.n - jr < KT ? q.n - jr : KT;
        for (int r = r_lo + warp; r < r_hi; r += kMmaWarps) {
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
            KV *kd = reinterpret_cast<KV *>(kt + r * D + lane * PER), *vd = reinterpret_cast<KV *>(vt + r * D + lane * PER);
#pragma unroll
            for (int e = 0; e < PER; e++) {
                store_quant(kd + e, kf[e], kscale);
                store_quant(vd + e, vf[e], vscale);
            }
            if (lane == 0) ksc[r] = kscale, vsc[r] = vscale;
        }
    }
}

/* The quants of a stage (kq, vq) as bf16 into the tiles kw, vw (swizzled
 * as mma_tile_load lays them out). */
template <typename KV, int D>
__device__ inline void mma_quant_widen(const unsigned char *kq, const unsigned char *vq, unsigned char *kw,
                                       unsigned char *vw) {
    constexpr int CH = D / 16;
    constexpr int KT = kTileBytes / (2 * D);
#pragma unroll
    for (int c = threadIdx.x; c < KT * CH; c += kThreads) {
        const int r = c / CH, pc = c % CH;
#pragma unroll
        for (int half = 0; half < 2; half++) { /* quants 8 half .. 8 half + 7 of the piece: bf16 chunk 2 pc + half */
            float kf[kE], vf[kE];
            load8(reinterpret_cast<const KV *>(kq + r * D + pc * 16 + half * 8), kf);
            load8(reinterpret_cast<const KV *>(vq + r * D + pc * 16 + half * 8), vf);
            const int o = swizzled<D>(r, 2 * pc + half);
            *reinterpret_cast<uint4 *>(kw + o) = make_uint4(pack_bf16(kf[0], kf[1]), pack_bf16(kf[2], kf[3]),
                                                            pack_bf16(kf[4], kf[5]), pack_bf16(kf[6], kf[7]));
            *reinterpret_cast<uint4 *>(vw + o) = make_uint4(pack_bf16(vf[0], vf[1]), pack_bf16(vf[2], vf[3]),
                                                            pack_bf16(vf[4], vf[5]), pack_bf16(vf[6], vf[7]));
        }
    }
}

/* q in shared memory rather than 32 registers a lane (D 128: q and O in
 * registers beside the loop's addresses pass the 128 that 4 blocks an SM
 * leave a thread). */
constexpr bool mma_q_shared(int D) { return D > 64; }
constexpr int mma_smem(int D) { return kSmem + (mma_q_shared(D) ? 16 * D * 2 : 0); }

template <typename KV, int D, bool BATCH>
__global__ void __launch_bounds__(kThreads, kWave) mma_attend_kernel(attend_params p) {
    constexpr bool QS = mma_q_shared(D);
    constexpr bool QUANT = kv_quant<KV>::value; /* int8 / fp8: quant stages, widened to bf16 tiles */
    using QM = mma_quant_smem<D>;
    constexpr int KT = kTileBytes / (2 * D); /* keys of a tile: 32 (D 128), 64 (D 64) */
    constexpr int KPW = KT / kMmaWarps;       /* keys of a tile per warp: 8, 16 */
    constexpr int NT = KPW / 8;               /* 8-key groups per warp and tile */
    constexpr int KC = D / 16;                /* k steps of q . k */
    constexpr int ND = D / 8;                 /* n tiles of the output */
    static_assert(KPW % 8 == 0 && D % 32 == 0 && D / 8 >= 8, "tile geometry");
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

    extern __shared__ __align__(16) unsigned char smem[];

    /* O of head gr, columns 8n + 2ti (+1) */
    float o[ND][2];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* m: the same in the 4 lanes of head gr; l: this lane's keys */

    mma_keys ks;
    {
        const int64_t row = (int64_t)p.Hkv * D; /* floats between rows of k, v */
        const int64_t row0 = t - (pos - L);     /* the row of k, v holding position L */
        ks.kb = rg.st.k + (int64_t)hk * D * (int64_t)sizeof(KV), ks.vb = rg.st.v + (int64_t)hk * D * (int64_t)sizeof(KV);
        ks.knew = p.k + row0 * row + (int64_t)hk * D, ks.vnew = p.v + row0 * row + (int64_t)hk * D;
        ks.k0 = k0;
        ks.row_bytes = rg.st.RS * (int64_t)sizeof(KV);
        ks.scale_rel = (int32_t)((int64_t)p.Hkv * D + (int64_t)hk * OG_KV_SCALE_BYTES - (int64_t)hk * D);
        ks.R = rg.st.R;
        ks.n = (int32_t)(k1 - k0);
        ks.n_stored = (int32_t)(L <= k0 ? 0 : L >= k1 ? k1 - k0 : L - k0);
        ks.row = (int32_t)row;
        ks.ring = p.ring;
        /* key k0 + j of this step (j >= n_stored) is row row0 + (k0 + j - L) of k, v */
        if (k0 > L) ks.knew += (k0 - L) * row, ks.vnew += (k0 - L) * row;
    }
    const int32_t n_tiles = (ks.n + KT - 1) / KT;
    /* stage b: bf16 tiles at 2b, 2b + 1 x kTileBytes; quantized: quants at
     * 2b, 2b + 1 x QM::tile and scales at QM::scales + [2b, 2b + 1] x KT f32 */
    auto load_stage = [&](const mma_keys &q, int32_t jr, int b) {
        if constexpr (QUANT) {
            float *sc0 = reinterpret_cast<float *>(smem + QM::scales) + 2 * b * KT;
            mma_quant_tile_load<KV, D>(q, jr, smem + 2 * b * QM::tile, smem + (2 * b + 1) * QM::tile, sc0, sc0 + KT);
        } else {
            mma_tile_load<D>(q, jr, smem + 2 * b * kTileBytes, smem + (2 * b + 1) * kTileBytes);
        }
    };
    /* the first stages: before the wait when they hold stored keys alone
     * (storage rows before L were written by earlier steps; a tile of stored
     * keys alone reads nothing of k, v) */
    const bool early = ks.n_stored >= min(ks.n, (kStages - 1) * KT);
    if (early) {
#pragma unroll
        for (int i = 0; i < kStages - 1; i++) {
            if (i < n_tiles) load_stage(ks, i * KT, i);
            copies_commit();
        }
    }
    og_cuda::grid_wait(); /* q, k, v (and the scratch) of the kernels before are ready */
    if (!early) {
#pragma unroll
        for (int i = 0; i < kStages - 1; i++) {
            if (i < n_tiles) load_stage(ks, i * KT, i);
            copies_commit();
        }
    }

    /* (after the first tiles are asked for: q's latency hides behind theirs)
     * A fragments of q: rows gr (hi) and gr + 8 (lo) of head h0 + gr, or
     * zeros past g_n; in registers, or (QS) a [16, D] bf16 tile in shared
     * memory past the K/V tiles that every k step reads by ldmatrix */
    unsigned char *qs = smem + (QUANT ? QM::q : kSmem);
    uint32_t qa[QS ? 1 : KC][4];
    if (!QS || warp == 0) { /* QS: warp 0 writes the tile, read after the barrier that opens the first tile */
        const bool live = gr < g_n;
        const float *qp = p.q + ((int64_t)t * p.Hq + h0 + (live ? gr : 0)) * D;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int col = kc * 16 + half * 8 + 2 * ti;
                float2 x = make_float2(0.0f, 0.0f);
                if (live) x = *reinterpret_cast<const float2 *>(qp + col);
                const float a = x.x * p.scale_log2, b = x.y * p.scale_log2;
                const float ah = __bfloat162float(__float2bfloat16_rn(a)), bh = __bfloat162float(__float2bfloat16_rn(b));
                const uint32_t hi = pack_bf16(ah, bh), lo = pack_bf16(a - ah, b - bh);
                if constexpr (QS) {
                    *reinterpret_cast<uint32_t *>(qs + swizzled<D>(gr, 2 * kc + half) + 4 * ti) = hi;
                    *reinterpret_cast<uint32_t *>(qs + swizzled<D>(gr + 8, 2 * kc + half) + 4 * ti) = lo;
                } else {
                    qa[QS ? 0 : kc][2 * half] = hi;     /* a0 / a2: row gr */
                    qa[QS ? 0 : kc][2 * half + 1] = lo; /* a1 / a3: row gr + 8 */
                }
            }
        }
    }
    /* ldmatrix rows of the q tile: lanes 0-7 rows 0-7 (a0), 8-15 rows 8-15
     * (a1), 16-23 rows 0-7 of the next chunk (a2), 24-31 rows 8-15 (a3) */
    const int q_row = (lane & 7) + (lane & 8), q_ch = lane >> 4;

    for (int32_t i = 0; i < n_tiles; i++) {
        copies_wait<kStages - 2>(); /* this thread's pieces of tile i are in */
        __syncthreads();            /* everyone's are (and their plain stores), and tile i - 1 is consumed */
        const int32_t next = i + kStages - 1;
        if (next < n_tiles) load_stage(ks, next * KT, next % kStages);
        copies_commit();
        const int b = i % kStages;
        const unsigned char *kt = smem + 2 * b * kTileBytes, *vt = smem + (2 * b + 1) * kTileBytes;
        const float *ksc = nullptr, *vsc = nullptr; /* QUANT: the stage's scales */
        if constexpr (QUANT) {
            kt = smem + QM::wide, vt = smem + QM::wide + kTileBytes;
            ksc = reinterpret_cast<const float *>(smem + QM::scales) + 2 * b * KT, vsc = ksc + KT;
            /* the bf16 tiles were last read before the barrier above */
            mma_quant_widen<KV, D>(smem + 2 * b * QM::tile, smem + (2 * b + 1) * QM::tile, smem + QM::wide,
                                   smem + QM::wide + kTileBytes);
            __syncthreads();
        }
        const int rw = warp * KPW;               /* this warp's first row in the tile */
        const int32_t live = ks.n - i * KT - rw; /* keys of its rows inside the split (may be <= 0) */

        /* S = Q K^T over the warp's keys: s[nt] rows gr, gr + 8 x tile rows rw + 8 nt + 2 ti (+1) */
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const int r = rw + nt * 8 + (lane & 7);
#pragma unroll
            for (int c4 = 0; c4 < KC / 2; c4++) { /* chunks 4 c4 .. 4 c4 + 3: k steps 2 c4, 2 c4 + 1 */
                uint32_t kb[4];
                ldmatrix_x4<false>(kb, kt + swizzled<D>(r, 4 * c4 + (lane >> 3)));
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int kc = 2 * c4 + u;
                    uint32_t a[4];
                    if constexpr (QS) {
                        ldmatrix_x4<false>(a, qs + swizzled<D>(q_row, 2 * kc + q_ch));
                    } else {
#pragma unroll
                        for (int f = 0; f < 4; f++) a[f] = qa[QS ? 0 : kc][f];
                    }
                    mma_bf16(s[nt], a, kb[2 * u], kb[2 * u + 1]);
                }
            }
        }
        /* scores of head gr (hi row + lo row), -inf past k1; online softmax */
        float sc[NT][2], mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float x = s[nt][e] + s[nt][2 + e];
                if constexpr (QUANT) x *= ksc[rw + nt * 8 + 2 * ti + e]; /* q . (k quants) x k scale */
                sc[nt][e] = nt * 8 + 2 * ti + e < live ? x : -INFINITY;
                mx = fmaxf(mx, sc[nt][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m, mx);
        const float base = mn == -INFINITY ? 0.0f : mn; /* no key yet: every weight is exp2(-inf) = 0 */
        const float cr = exp2f(m - base);
        m = mn;
        l *= cr;
#pragma unroll
        for (int n = 0; n < ND; n++) o[n][0] *= cr, o[n][1] *= cr;

        /* O += P V, 8 keys at a time: P rows gr = bf16(p), gr + 8 = bf16(p - bf16(p)) */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float p0 = exp2f(sc[nt][0] - base), p1 = exp2f(sc[nt][1] - base);
            l += p0 + p1;
            if constexpr (QUANT) { /* the weight of the value quants: p x v scale */
                p0 *= vsc[rw + nt * 8 + 2 * ti];
                p1 *= vsc[rw + nt * 8 + 2 * ti + 1];
            }
            const float h0f = __bfloat162float(__float2bfloat16_rn(p0)), h1f = __bfloat162float(__float2bfloat16_rn(p1));
            const uint32_t a0 = pack_bf16(h0f, h1f), a1 = pack_bf16(p0 - h0f, p1 - h1f);
            const int r = rw + nt * 8 + (lane & 7);
#pragma unroll
            for (int c4 = 0; c4 < ND / 4; c4++) { /* chunks 4 c4 .. 4 c4 + 3: n tiles of O */
                uint32_t vb[4];
                ldmatrix_x4<true>(vb, vt + swizzled<D>(r, 4 * c4 + (lane >> 3)));
#pragma unroll
                for (int u = 0; u < 4; u++) mma_bf16_k8_fold(o[4 * c4 + u], a0, a1, vb[u]);
            }
        }
    }
    copies_wait<0>();

    if (split == S - 1 && chunk_i == 0) write_own_row<KV>(p, rg.st, pos, t, hk);

    /* 3. the 4 warps' partials to shared memory (the tiles are consumed), as
     * finish_split reads them: [4, 8] maxima, [4, 8] sums, [4, 8, D] accumulators */
    __syncthreads();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float *sm = reinterpret_cast<float *>(smem);
    float *sm_m = sm, *sm_l = sm + kMmaWarps * 8, *sm_acc = sm + 2 * kMmaWarps * 8;
    if (ti == 0) {
        sm_m[warp * 8 + gr] = m;
        sm_l[warp * 8 + gr] = l;
    }
#pragma unroll
    for (int n = 0; n < ND; n++)
        *reinterpret_cast<float2 *>(sm_acc + (warp * 8 + gr) * D + n * 8 + 2 * ti) =
            make_float2(o[n][0], o[n][1]);
    __syncthreads();
    finish_split<8>(p, sm, kMmaWarps, g_n, h0, t, S, split);
}

template <typename KV, int D, bool BATCH>
cudaError_t launch_mma_d(const attend_params &p, dim3 grid, cudaStream_t st, int dev) {
    constexpr int smem = kv_quant<KV>::value ? mma_quant_smem<D>::total : mma_smem(D);
    static std::atomic<unsigned long long> done{0};
    const cudaError_t e = allow_smem(mma_attend_kernel<KV, D, BATCH>, smem, dev, done);
    if (e != cudaSuccess) return e;
    /* no programmatic dependent launch (see the header) */
    og_cuda::launch_after_smem(mma_attend_kernel<KV, D, BATCH>, grid, dim3(kThreads), smem, st, p);
    return cudaGetLastError();
}

template <typename KV, bool BATCH>
cudaError_t launch_mma_kv(const attend_params &p, dim3 grid, cudaStream_t st, int dev) {
    return p.D == 64 ? launch_mma_d<KV, 64, BATCH>(p, grid, st, dev) : launch_mma_d<KV, 128, BATCH>(p, grid, st, dev);
}

} /* namespace */

cudaError_t launch_mma(const attend_params &p, og_dtype dt, dim3 grid, cudaStream_t st, int dev, bool batch) {
    switch (dt) {
    case OG_DTYPE_INT8:
        return batch ? launch_mma_kv<kv_i8, true>(p, grid, st, dev) : launch_mma_kv<kv_i8, false>(p, grid, st, dev);
    case OG_DTYPE_FP8:
        return batch ? launch_mma_kv<kv_e4m3, true>(p, grid, st, dev)
                     : launch_mma_kv<kv_e4m3, false>(p, grid, st, dev);
    default:
        return batch ? launch_mma_kv<__nv_bfloat16, true>(p, grid, st, dev)
                     : launch_mma_kv<__nv_bfloat16, false>(p, grid, st, dev);
    }
}

} /* namespace og_attend */
