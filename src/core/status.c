/* Status names, dtype helpers and the per-thread last error. */
#include "core.h"

#include <stdio.h>

const char *og_status_str(og_status s) {
    switch (s) {
    case OG_OK: return "ok";
    case OG_ERR_INVALID_ARGUMENT: return "invalid argument";
    case OG_ERR_OUT_OF_MEMORY: return "out of memory";
    case OG_ERR_INVALID_CONFIG: return "invalid KV configuration";
    case OG_ERR_WRITE_TOO_WIDE: return "step wider than max_write";
    case OG_ERR_CAPACITY: return "write past max_capacity";
    case OG_ERR_POSITION: return "positions disagree with the committed length";
    case OG_ERR_UNBOUND: return "runtime tensor unbound";
    case OG_ERR_IO: return "I/O error";
    case OG_ERR_FORMAT: return "malformed file";
    case OG_ERR_UNSUPPORTED: return "unsupported";
    case OG_ERR_STATE: return "call out of order";
    case OG_ERR_BACKEND: return "back-end failure";
    case OG_ERR_NO_DEVICE: return "no device";
    case OG_ERR_BUSY: return "busy";
    }
    return "unknown status";
}

static _Thread_local char g_last_error[OG_ERRMSG_CAP];

const char *og_last_error(void) { return g_last_error; }

og_status og_set_errorv(og_status st, const char *fmt, va_list ap) {
    /* format aside first: an argument may be og_last_error() itself */
    char msg[OG_ERRMSG_CAP];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(g_last_error, msg, sizeof msg);
    return st;
}

og_status og_set_error(og_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    og_set_errorv(st, fmt, ap);
    va_end(ap);
    return st;
}

og_status og_errbuf_set(og_errbuf *e, og_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    og_set_errorv(st, fmt, ap);
    va_end(ap);
    if (e) snprintf(e->msg, sizeof e->msg, "%s", g_last_error);
    return st;
}

static const struct {
    const char *name;
    size_t size;
} g_dtypes[OG_DTYPE_COUNT] = {
    [OG_DTYPE_F32] = {"f32", 4}, [OG_DTYPE_BF16] = {"bf16", 2}, [OG_DTYPE_F16] = {"f16", 2},
    [OG_DTYPE_I32] = {"i32", 4}, [OG_DTYPE_I64] = {"i64", 8},   [OG_DTYPE_Q8] = {"q8", 0},
    [OG_DTYPE_Q4] = {"q4", 0},   [OG_DTYPE_INT8] = {"int8", 1}, [OG_DTYPE_FP8] = {"fp8", 1},
    [OG_DTYPE_Q2_K] = {"q2_k", 0}, [OG_DTYPE_Q3_K] = {"q3_k", 0}, [OG_DTYPE_Q4_K] = {"q4_k", 0},
    [OG_DTYPE_Q5_K] = {"q5_k", 0}, [OG_DTYPE_Q6_K] = {"q6_k", 0},
};

size_t og_dtype_size(og_dtype dt) {
    return (unsigned)dt < OG_DTYPE_COUNT ? g_dtypes[dt].size : 0;
}

bool og_dtype_is_kquant(og_dtype dt) {
    return dt >= OG_DTYPE_Q2_K && dt <= OG_DTYPE_Q6_K;
}

bool og_dtype_is_quantized(og_dtype dt) {
    return dt == OG_DTYPE_Q8 || dt == OG_DTYPE_Q4 || og_dtype_is_kquant(dt);
}

bool og_tensor_bytes(og_dtype dt, int32_t rank, const int64_t *shape, int64_t *bytes) {
    if ((unsigned)dt >= OG_DTYPE_COUNT || !shape || rank < 1 || rank > 4) return false;
    int64_t n = 1;
    for (int32_t k = 0; k < rank; k++)
        if (shape[k] <= 0 || !og_mul_overflow_i64(n, shape[k], &n)) return false;
    if (og_dtype_is_kquant(dt)) {
        if (rank != 2 || shape[1] % OG_KQUANT_BLOCK) return false;
        /* whole super-blocks: n / 256 of them, at most 210 bytes each */
        n = n / OG_KQUANT_BLOCK * (int64_t)og_kquant_block_bytes(dt);
    } else if (og_dtype_is_quantized(dt)) {
        /* a matrix, or a stack of them (the experts of a moe instruction) */
        if (rank < 2 || rank > 3 || shape[rank - 1] % OG_QUANT_GROUP) return false;
        /* quants (a byte or half a byte each), then one f16 scale per group */
        int64_t quants = dt == OG_DTYPE_Q8 ? n : n / 2;
        n = quants + n / OG_QUANT_GROUP * 2;
    } else if (!og_mul_overflow_i64(n, (int64_t)g_dtypes[dt].size, &n)) {
        return false;
    }
    *bytes = n;
    return true;
}

const char *og_dtype_name(og_dtype dt) {
    return (unsigned)dt < OG_DTYPE_COUNT ? g_dtypes[dt].name : "unknown";
}

og_status og_dtype_parse(const char *name, og_dtype *out) {
    if (!name || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "dtype: NULL argument");
    for (int i = 0; i < OG_DTYPE_COUNT; i++) {
        if (strcmp(name, g_dtypes[i].name) == 0) {
            *out = (og_dtype)i;
            return OG_OK;
        }
    }
    return og_set_error(OG_ERR_INVALID_ARGUMENT, "unknown dtype \"%s\" (known: f32, bf16, f16, i32, i64, q8, q4, int8, fp8)",
                        name);
}
