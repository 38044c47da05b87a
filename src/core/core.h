/* core: status strings, error messages, host allocation, logging,
 * bf16/f16 conversion, and the thread pool. Knows nothing about models. */
#ifndef OG_CORE_H
#define OG_CORE_H

#include "offgraph.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define OG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define OG_PRINTF(a, b)
#endif

/* ---- errors ---- */

/* Sets the thread's last error (og_last_error) and returns st. */
og_status og_set_error(og_status st, const char *fmt, ...) OG_PRINTF(2, 3);
og_status og_set_errorv(og_status st, const char *fmt, va_list ap);

/* Returns the status of expr from the calling function unless it is OG_OK. */
#define OG_TRY(expr)                  \
    do {                              \
        og_status st_ = (expr);       \
        if (st_ != OG_OK) return st_; \
    } while (0)

/* A fixed buffer for per-handle error messages. */
#define OG_ERRMSG_CAP 512
typedef struct og_errbuf {
    char msg[OG_ERRMSG_CAP];
} og_errbuf;
/* Returns st from the calling function after running `cleanup` (a
 * statement, e.g. the destructor of what a failed constructor built, which
 * may set errors of its own), with the thread's last error as it was
 * before cleanup ran. */
#define OG_RETURN_AFTER(st, cleanup)                 \
    do {                                             \
        og_errbuf why_;                              \
        const char *last_ = og_last_error();         \
        size_t n_ = strlen(last_);                   \
        if (n_ >= sizeof why_.msg) n_ = sizeof why_.msg - 1; \
        memcpy(why_.msg, last_, n_);                 \
        why_.msg[n_] = 0;                            \
        cleanup;                                     \
        return og_set_error((st), "%s", why_.msg);   \
    } while (0)

/* Formats into e (if non-NULL) and into the thread's last error; returns st. */
og_status og_errbuf_set(og_errbuf *e, og_status st, const char *fmt, ...) OG_PRINTF(3, 4);

/* ---- host memory (through og_set_host_allocator hooks) ---- */

/* Owned by the caller: og_free. Returns NULL on failure (size 0 -> NULL). */
void *og_malloc(size_t bytes);
/* Zero-filled; checks count * size for overflow. Owned by the caller: og_free. */
void *og_calloc(size_t count, size_t size);
void *og_realloc(void *ptr, size_t bytes);
void og_free(void *ptr);
/* Owned by the caller: og_free. */
char *og_strdup(const char *s);

/* Scratch of the calling thread that outlives the call: slot s holds a
 * buffer of at least `bytes` (16-byte aligned, contents undefined), grown
 * when a call asks for more and kept until the thread exits. Kernels that
 * pack operands on every call take their scratch here instead of og_malloc:
 * memory handed back and asked again comes as fresh zeroed pages, which cost
 * a 0.6B prefill on 2 cores more than its packing (575-735 -> 851-862
 * tok/s with the allocator told to keep it). A slot serves one user at a
 * time: a kernel that calls another takes a different slot. NULL when out of
 * memory. og_scratch_release frees the calling thread's buffers now. */
typedef enum og_scratch_slot {
    OG_SCRATCH_ACTIVATIONS, /* a product's input packed or rounded       */
    OG_SCRATCH_PANELS,      /* a product's weight panels, per thread      */
    OG_SCRATCH_ATTEND,      /* attention's tiles, partials, packed keys   */
    OG_SCRATCH_QUANT_X,     /* a k-quant product's input as int8 blocks   */
    OG_SCRATCH_SLOTS
} og_scratch_slot;
void *og_scratch(og_scratch_slot slot, size_t bytes);
void og_scratch_release(void);

/* Checked arithmetic: return false on overflow (result untouched). */
bool og_mul_overflow_i64(int64_t a, int64_t b, int64_t *out);
bool og_add_overflow_i64(int64_t a, int64_t b, int64_t *out);

/* ---- logging ---- */
void og_log(og_log_level level, const char *fmt, ...) OG_PRINTF(2, 3);
#define OG_DEBUG(...) og_log(OG_LOG_DEBUG, __VA_ARGS__)
#define OG_INFO(...) og_log(OG_LOG_INFO, __VA_ARGS__)
#define OG_WARN(...) og_log(OG_LOG_WARN, __VA_ARGS__)

/* ---- byte order ---- */

/* Little-endian fields of file headers (program files, saved sessions). */
static inline uint32_t og_le32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t og_le64(const uint8_t *b) { return og_le32(b) | (uint64_t)og_le32(b + 4) << 32; }
static inline void og_put_le32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static inline void og_put_le64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* ---- bf16 / f16 ---- */

typedef uint16_t og_bf16;
typedef uint16_t og_f16;

/* Round to nearest even; NaN stays a (quiet) NaN. */
static inline og_bf16 og_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (og_bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (og_bf16)(u >> 16);
}
static inline float og_f32_from_bf16(og_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
og_f16 og_f16_from_f32(float f);
float og_f32_from_f16(og_f16 h);

/* Loads element i of a bf16 or f32 buffer as f32. */
static inline float og_load_f32(const void *base, og_dtype dt, size_t i) {
    return dt == OG_DTYPE_BF16 ? og_f32_from_bf16(((const og_bf16 *)base)[i])
                               : ((const float *)base)[i];
}
static inline void og_store_f32(void *base, og_dtype dt, size_t i, float x) {
    if (dt == OG_DTYPE_BF16)
        ((og_bf16 *)base)[i] = og_bf16_from_f32(x);
    else
        ((float *)base)[i] = x;
}

/* ---- quantized weights (q8, q4; the layout is at OG_QUANT_GROUP) ---- */

/* ---- k-quants (q2_k .. q6_k; the layouts are in docs/program-format.md) ---- */

/* Bytes of one super-block of OG_KQUANT_BLOCK elements; 0 for other dtypes. */
static inline size_t og_kquant_block_bytes(og_dtype dt) {
    switch (dt) {
    case OG_DTYPE_Q2_K: return 84;
    case OG_DTYPE_Q3_K: return 110;
    case OG_DTYPE_Q4_K: return 144;
    case OG_DTYPE_Q5_K: return 176;
    case OG_DTYPE_Q6_K: return 210;
    default: return 0;
    }
}
/* Bytes of one row of K elements (K a multiple of OG_KQUANT_BLOCK). */
static inline size_t og_kquant_row_bytes(og_dtype dt, int64_t K) {
    return (size_t)(K / OG_KQUANT_BLOCK) * og_kquant_block_bytes(dt);
}
/* Elements per block of a quantized dtype: the row length must be a
 * multiple of it (OG_QUANT_GROUP or OG_KQUANT_BLOCK); 1 for float dtypes. */
static inline int64_t og_quant_block_elems(og_dtype dt) {
    return og_dtype_is_kquant(dt) ? OG_KQUANT_BLOCK : og_dtype_is_quantized(dt) ? OG_QUANT_GROUP : 1;
}

/* Row n of a [N, K] k-quant tensor as f32, bit for bit what the gguf Python
 * package (llama.cpp's gguf-py) dequantizes: per sub-block the f32 product
 * of the f16 super-block scale and the sub-block's integer scale (dl), of
 * the f16 min scale and the integer min (ml; q2_k, q4_k, q5_k), then each
 * element dl * q - ml (or dl * q). */
void og_kquant_dequantize_row(og_dtype dt, const void *w, int64_t K, int64_t n, float *out /* [K] */);
/* Quantizes rows [N, K] of f32 into dst (og_tensor_bytes of [N, K]) as
 * llama.cpp's llama-quantize does without an importance matrix: the same
 * search for sub-block scales and mins, in the same f32 operations and
 * order, so the bytes equal the ones it writes for the same input. A
 * non-finite element is OG_ERR_INVALID_ARGUMENT naming the row (dst then
 * partly written). */
og_status og_kquant_quantize_rows(og_dtype dt, const float *src /* [N, K] */, int64_t N, int64_t K, void *dst);
/* The same for rows r0 .. r1 - 1 only (in place in the [N, K] dst). */
og_status og_kquant_quantize_row_range(og_dtype dt, const float *src /* [N, K] */, int64_t N, int64_t K, int64_t r0,
                                       int64_t r1, void *dst);

/* The dtype of a matmul bias beside a weight of dtype w: w itself for float
 * weights, f32 beside quantized ones. */
static inline og_dtype og_bias_dtype(og_dtype w) {
    return og_dtype_is_quantized(w) ? OG_DTYPE_F32 : w;
}
/* q8/q4: bytes of quants in one row of K elements (K a multiple of the
 * group). */
static inline size_t og_quant_row_bytes(og_dtype dt, int64_t K) {
    return dt == OG_DTYPE_Q8 ? (size_t)K : (size_t)K / 2;
}
/* Where the scales of a [N, K] quantized tensor start: after every row's
 * quants. The scales are [N, K / OG_QUANT_GROUP] f16. */
static inline const og_f16 *og_quant_scales(og_dtype dt, const void *w, int64_t N, int64_t K) {
    return (const og_f16 *)((const char *)w + (size_t)N * og_quant_row_bytes(dt, K));
}
/* Quantizes rows [N, K] of f32 into dst (og_tensor_bytes of [N, K]): per
 * group the scale is the f16 nearest to amax / 127 (q8) or to m / -8 with m
 * the element of largest magnitude (q4, so that m itself is -8), and each
 * element the nearest integer to x / scale (with the stored scale), clamped
 * to [-127, 127] or [-8, 7]. A non-finite element or scale is
 * OG_ERR_INVALID_ARGUMENT naming the row; dst is then partly written. */
og_status og_quantize_rows(og_dtype dt, const float *src /* [N, K] */, int64_t N, int64_t K, void *dst);
/* The same for rows r0 .. r1 - 1 only (their quants and scales, in place in
 * the [N, K] dst): disjoint ranges can be quantized by different threads. */
og_status og_quantize_row_range(og_dtype dt, const float *src /* [N, K] */, int64_t N, int64_t K, int64_t r0,
                                int64_t r1, void *dst);
/* Row n of a [N, K] quantized tensor as f32. q8/q4: element = f32(scale) *
 * q, which f32 holds exactly (an 11-bit scale times a 4- or 8-bit integer);
 * k-quants: og_kquant_dequantize_row. */
void og_dequantize_row(og_dtype dt, const void *w, int64_t N, int64_t K, int64_t n, float *out /* [K] */);
/* Bytes a [rows, K] weight of dt takes per row, scales included (q8/q4: the
 * quants plus K / OG_QUANT_GROUP f16 scales, apart in the tensor). */
static inline size_t og_weight_row_bytes(og_dtype dt, int64_t K) {
    if (og_dtype_is_kquant(dt)) return og_kquant_row_bytes(dt, K);
    if (og_dtype_is_quantized(dt)) return og_quant_row_bytes(dt, K) + (size_t)(K / OG_QUANT_GROUP) * 2;
    return (size_t)K * og_dtype_size(dt);
}

/* ---- threads ---- */

/* A fixed pool of workers running parallel-fors. The calling thread takes
 * part, so a pool of n threads starts n - 1 workers. */
typedef struct og_threadpool og_threadpool;
/* n_threads <= 0 means the number of online CPUs. Owned by the caller:
 * og_threadpool_destroy. Returns NULL when threads cannot be started. */
og_threadpool *og_threadpool_create(int n_threads);
void og_threadpool_destroy(og_threadpool *p);
int og_threadpool_size(const og_threadpool *p);
/* Runs fn(ctx, i, thread) for i in [0, n) across the pool and waits.
 * thread is in [0, size), and no two items of one call run at once with the
 * same thread (the caller is 0). p == NULL runs everything on the caller
 * (thread 0). Calls from different threads on one pool run side by side,
 * sharing its workers. A call from inside an item of the same pool (nested),
 * or past 16 calls at once, runs its items on the calling thread, in order,
 * as thread 0. */
typedef void (*og_task_fn)(void *ctx, int64_t i, int thread);
void og_parallel_for(og_threadpool *p, int64_t n, og_task_fn fn, void *ctx);
/* Tests only: called, when set, at each window of the pool's protocol where
 * a thread's preemption matters (tests/test_threadpool.c sleeps there at
 * random). Set it while no pool is in use. */
extern void (*og_threadpool_test_delay)(int window);

/* A growable string: p is NUL-terminated once anything was added (NULL
 * before), n bytes long. oom is set when memory ran out (or printf failed);
 * from then on adds do nothing, and the owner frees p (og_free) either way.
 * A zeroed og_strbuf is empty. */
typedef struct og_strbuf {
    char *p;
    size_t n, cap;
    bool oom;
} og_strbuf;
void og_strbuf_add(og_strbuf *b, const char *s, size_t n);
void og_strbuf_printf(og_strbuf *b, const char *fmt, ...) OG_PRINTF(2, 3);

/* Monotonic clock in seconds. */
double og_time_now(void);
/* Waits on c (m held, as pthread_cond_wait) until it is signalled or
 * og_time_now() reaches `until` (a time of that clock); returns
 * pthread_cond_timedwait's result: ETIMEDOUT once `until` has passed. */
int og_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, double until);

#endif /* OG_CORE_H */
