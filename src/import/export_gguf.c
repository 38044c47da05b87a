/* GGUF import: a llama.cpp model file mapped onto the model the Hugging
 * Face path lowers (export.c), so that both give the same program.
 *
 *   hyperparameters  <arch>.block_count, embedding_length, feed_forward_length,
 *                    attention.head_count, head_count_kv, key_length,
 *                    attention.layer_norm_rms_epsilon, context_length,
 *                    rope.freq_base, rope.scaling.type/factor (none, linear),
 *                    attention.sliding_window (+ _pattern, one bool a layer)
 *   weights          token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
 *                    attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate,
 *                    ffn_up, ffn_down}.weight (+ .bias), output_norm, output
 *                    (absent: tied embeddings); rope_freqs (llama3 scaling);
 *                    qwen3moe's ffn_gate_inp and ffn_{gate,up,down}_exps;
 *                    qwen3next's hybrid layers (map_hybrid_layer) with
 *                    their shared experts (ffn_*_shexp, ffn_gate_inp_shexp)
 *   tokenizer        tokenizer.ggml.* (byte-level BPE; SentencePiece BPE,
 *                    its merges derived from the scores) rebuilt as the
 *                    tokenizer.json / tokenizer_config.json texts the
 *                    tokenizer loader reads
 *
 * ne[] is reversed relative to the Hugging Face shape (ne[0] is a row). The
 * llama.cpp converter reorders the rows of llama q and k (per head, the two
 * rotary halves interleaved: row 2i+s of a head holds row s*D/2+i); the
 * exporter puts them back. q8_0 (blocks of 32: an f16 scale and 32 int8)
 * and q4_0 (an f16 scale and 16 bytes: element j in the low nibble of byte
 * j, element j + 16 in its high nibble, as q + 8) are offgraph's q8 and q4
 * one block at a time, so with those weights they are copied exactly (block
 * quants to the quants plane, scales to the scales plane); into a float
 * dtype they are dequantized, scale * q (exact in f32), then rounded. The
 * k-quants (q2_K .. q6_K) are offgraph's q2_k .. q6_k block for block: a
 * row is copied as it is (rows reordered as above where needed, a row
 * being whole super-blocks), or dequantized by og_kquant_dequantize_row. A
 * file with quantized matrices is exported with each as stored unless
 * other weights are asked (OG_MIX_AS_STORED). Other quantizations (IQ
 * types, q4_1, q5_0, ...) are refused naming the type. */
#include "core/core.h"
#include "import/export.h"
#include "import/gguf.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OG_PI 3.14159265358979323846

/* Token types of tokenizer.ggml.token_type. */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

/* Values the converter changed, put back (read as f32, then stored). */
typedef enum gxform {
    GX_NONE = 0,
    GX_MINUS_ONE, /* a (1 + w) norm weight stored as 1 + w: w            */
    GX_LOG_NEG    /* A_log stored as -exp(A_log): log(-a)                */
} gxform;

typedef struct gmap {
    og_st_tensor t;            /* Hugging Face name and shape; data in the mapping */
    const og_gguf_tensor *g;
    int32_t permute_heads;     /* > 0: undo the q/k row interleave, per head    */
    int64_t row0;              /* first row of g it is (an expert of a 3-D one) */
    /* take > 0: rows gathered in groups, row r from r / take * group + off +
     * r % take (qwen3next's ssm_ba: per key head its b rows, then its a) */
    int64_t take, group, off;
    gxform xform;
    char hf_name[96];
} gmap;

typedef struct gsrc {
    og_gguf *g;
    const char *path;
    gmap *maps; /* sorted by Hugging Face name once built */
    int32_t n, cap;
} gsrc;

static int cmp_gmap(const void *a, const void *b) {
    return strcmp(((const gmap *)a)->hf_name, ((const gmap *)b)->hf_name);
}

static const og_st_tensor *gsrc_find(void *ctx, const char *name) {
    gsrc *s = ctx;
    gmap key;
    snprintf(key.hf_name, sizeof key.hf_name, "%s", name);
    gmap *m = bsearch(&key, s->maps, (size_t)s->n, sizeof key, cmp_gmap);
    return m ? &m->t : NULL;
}

/* Row r of src (q8_0 or q4_0 blocks) into row r of a q8 / q4 tensor of
 * rows x cols: the same numbers, the planes split. */
static void copy_blocks(const og_gguf_tensor *g, int64_t src, int64_t r, int64_t rows, int64_t cols, og_dtype dt,
                        void *out) {
    const size_t qbytes = dt == OG_DTYPE_Q8 ? 32 : 16, block = 2 + qbytes;
    const uint8_t *row = (const uint8_t *)g->data + (size_t)src * (size_t)(cols / 32) * block;
    uint8_t *q = (uint8_t *)out + (size_t)r * og_quant_row_bytes(dt, cols);
    uint8_t *scales = (uint8_t *)out + (size_t)rows * og_quant_row_bytes(dt, cols) + (size_t)r * (size_t)(cols / 32) * 2;
    for (int64_t b = 0; b < cols / 32; b++) {
        memcpy(scales + b * 2, row + b * block, 2);
        memcpy(q + b * qbytes, row + b * block + 2, qbytes);
    }
}

/* The offgraph k-quant of a ggml k-quant type (OG_DTYPE_COUNT for others). */
static og_dtype kquant_dtype(uint32_t type) {
    switch (type) {
    case OG_GGML_Q2_K: return OG_DTYPE_Q2_K;
    case OG_GGML_Q3_K: return OG_DTYPE_Q3_K;
    case OG_GGML_Q4_K: return OG_DTYPE_Q4_K;
    case OG_GGML_Q5_K: return OG_DTYPE_Q5_K;
    case OG_GGML_Q6_K: return OG_DTYPE_Q6_K;
    default: return OG_DTYPE_COUNT;
    }
}

/* Row r of a tensor with rows of `cols` as f32; qrow: scratch of a q8 row
 * (og_tensor_bytes of [1, cols]). */
static void load_row(const og_gguf_tensor *g, int64_t r, int64_t cols, float *out, void *qrow) {
    const uint8_t *base = g->data;
    switch (g->type) {
    case OG_GGML_F32: memcpy(out, base + (size_t)(r * cols) * 4, (size_t)cols * 4); break;
    case OG_GGML_F16:
        for (int64_t k = 0; k < cols; k++) {
            og_f16 h;
            memcpy(&h, base + (size_t)(r * cols + k) * 2, 2);
            out[k] = og_f32_from_f16(h);
        }
        break;
    case OG_GGML_BF16:
        for (int64_t k = 0; k < cols; k++) {
            og_bf16 h;
            memcpy(&h, base + (size_t)(r * cols + k) * 2, 2);
            out[k] = og_f32_from_bf16(h);
        }
        break;
    case OG_GGML_Q4_0:
    case OG_GGML_Q8_0: { /* the blocks as a one-row q4 / q8 tensor, read by the reference */
        const og_dtype dt = g->type == OG_GGML_Q8_0 ? OG_DTYPE_Q8 : OG_DTYPE_Q4;
        copy_blocks(g, r, 0, 1, cols, dt, qrow);
        og_dequantize_row(dt, qrow, 1, cols, 0, out);
        break;
    }
    case OG_GGML_Q2_K:
    case OG_GGML_Q3_K:
    case OG_GGML_Q4_K:
    case OG_GGML_Q5_K:
    case OG_GGML_Q6_K: og_kquant_dequantize_row(kquant_dtype(g->type), g->data, cols, r, out); break;
    default: break; /* refused before */
    }
}

/* The writer's fill: rows in Hugging Face order, converted to dst (a
 * quantized dst only from the same format: the exporter asks for f32 and
 * quantizes otherwise). */
static og_status gsrc_fill(void *ctx, const og_st_tensor *t, og_dtype dst, void *out) {
    (void)ctx;
    const gmap *m = (const gmap *)t; /* t is the first member */
    const og_gguf_tensor *g = m->g;
    const int64_t cols = g->ne[0], rows = t->numel / cols;
    const int64_t half = m->permute_heads ? rows / m->permute_heads / 2 : 0;
    if (og_dtype_is_quantized(dst) && dst != t->dtype)
        return og_set_error(OG_ERR_STATE, "export: tensor \"%s\": %s asked of a %s tensor", t->name,
                            og_dtype_name(dst), og_ggml_type_name(g->type));
    float *row = og_malloc((size_t)cols * sizeof *row);
    void *qrow = og_malloc((size_t)cols + (size_t)cols / 16 + 64); /* a q8 row: quants and scales */
    if (!row || !qrow) {
        og_free(row);
        og_free(qrow);
        return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = r + m->row0;
        if (half) { /* r = head h, half s, index i; stored at h*2*half + 2i + s */
            int64_t h = r / (2 * half), s = (r % (2 * half)) / half, i = r % half;
            src = h * 2 * half + 2 * i + s;
        }
        if (m->take) src = r / m->take * m->group + m->off + r % m->take;
        if (m->xform != GX_NONE) {
            load_row(g, src, cols, row, qrow);
            for (int64_t k = 0; k < cols; k++) {
                const float x = row[k];
                og_store_f32(out, dst, (size_t)(r * cols + k), m->xform == GX_MINUS_ONE ? x - 1.0f : logf(-x));
            }
            continue;
        }
        if (og_dtype_is_kquant(dst)) { /* the same blocks: the row as it is */
            const size_t rb = og_kquant_row_bytes(dst, cols);
            memcpy((uint8_t *)out + (size_t)r * rb, (const uint8_t *)g->data + (size_t)src * rb, rb);
            continue;
        }
        if (og_dtype_is_quantized(dst)) {
            copy_blocks(g, src, r, rows, cols, dst, out);
            continue;
        }
        if (g->type == OG_GGML_F32 && dst == OG_DTYPE_F32) {
            memcpy((float *)out + r * cols, (const float *)g->data + src * cols, (size_t)cols * 4);
            continue;
        }
        if (g->type == OG_GGML_BF16 && dst == OG_DTYPE_BF16) {
            memcpy((og_bf16 *)out + r * cols, (const og_bf16 *)g->data + src * cols, (size_t)cols * 2);
            continue;
        }
        load_row(g, src, cols, row, qrow);
        for (int64_t k = 0; k < cols; k++) og_store_f32(out, dst, (size_t)(r * cols + k), row[k]);
    }
    og_free(row);
    og_free(qrow);
    return OG_OK;
}

/* Maps GGUF tensor gname (must exist unless optional) to hf_name with the
 * Hugging Face shape [d0] or [d0, d1]. *present tells whether it was found. */
static og_status map_tensor(gsrc *s, const char *gname, const char *hf_name, int32_t rank, int64_t d0, int64_t d1,
                            int32_t permute_heads, bool optional, bool *present) {
    const og_gguf_tensor *g = og_gguf_find_tensor(s->g, gname);
    if (present) *present = g != NULL;
    if (!g) {
        if (optional) return OG_OK;
        return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\" is missing", s->path, gname);
    }
    const int64_t want_ne0 = rank == 1 ? d0 : d1, want_ne1 = rank == 1 ? 1 : d0;
    if (g->ne[0] != want_ne0 || g->ne[1] != want_ne1 || g->ne[2] != 1 || g->ne[3] != 1)
        return og_set_error(OG_ERR_FORMAT,
                            "gguf %s: tensor \"%s\" has ne [%lld, %lld, %lld, %lld], the metadata implies [%lld, %lld]",
                            s->path, gname, (long long)g->ne[0], (long long)g->ne[1], (long long)g->ne[2],
                            (long long)g->ne[3], (long long)want_ne0, (long long)want_ne1);
    og_dtype dt;
    switch (g->type) {
    case OG_GGML_F32: dt = OG_DTYPE_F32; break;
    case OG_GGML_F16: dt = OG_DTYPE_F16; break;
    case OG_GGML_BF16: dt = OG_DTYPE_BF16; break;
    case OG_GGML_Q8_0: dt = OG_DTYPE_Q8; break; /* its blocks are q8's groups */
    case OG_GGML_Q4_0: dt = OG_DTYPE_Q4; break;
    case OG_GGML_Q2_K:
    case OG_GGML_Q3_K:
    case OG_GGML_Q4_K:
    case OG_GGML_Q5_K:
    case OG_GGML_Q6_K: dt = kquant_dtype(g->type); break;
    default:
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "gguf %s: tensor \"%s\" has type %s: not supported (f32, f16, bf16, q8_0, q4_0, q2_K, "
                            "q3_K, q4_K, q5_K, q6_K)", s->path, gname, og_ggml_type_name(g->type));
    }
    if (permute_heads && d0 % (2 * permute_heads))
        return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\": %lld rows do not split into %d heads of rotary halves",
                            s->path, gname, (long long)d0, permute_heads);
    if (s->n == s->cap) return og_set_error(OG_ERR_STATE, "export: more GGUF tensors than planned (%d)", s->cap);
    gmap *m = &s->maps[s->n++];
    memset(m, 0, sizeof *m);
    snprintf(m->hf_name, sizeof m->hf_name, "%s", hf_name);
    m->g = g;
    m->permute_heads = permute_heads;
    m->t.name = m->hf_name;
    m->t.dtype = dt;
    m->t.rank = rank;
    m->t.shape[0] = d0;
    m->t.shape[1] = rank == 2 ? d1 : 0;
    m->t.numel = rank == 2 ? d0 * d1 : d0;
    m->t.data = g->data;
    m->t.nbytes = g->nbytes;
    m->t.file = s->path;
    return OG_OK;
}

/* Expert e of the 3-D GGUF tensor gname (ne [K, n, E]) as the [n, K]
 * tensor hf_name: its rows e*n .. e*n + n - 1. */
static og_status map_expert(gsrc *s, const char *gname, const char *hf_name, int64_t e, int64_t E, int64_t n, int64_t K) {
    const og_gguf_tensor *g = og_gguf_find_tensor(s->g, gname);
    if (!g) return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"%s\" is missing", s->path, gname);
    if (g->ne[0] != K || g->ne[1] != n || g->ne[2] != E || g->ne[3] != 1)
        return og_set_error(OG_ERR_FORMAT,
                            "gguf %s: tensor \"%s\" has ne [%lld, %lld, %lld, %lld], the metadata implies [%lld, %lld, %lld]",
                            s->path, gname, (long long)g->ne[0], (long long)g->ne[1], (long long)g->ne[2],
                            (long long)g->ne[3], (long long)K, (long long)n, (long long)E);
    og_dtype dt;
    switch (g->type) {
    case OG_GGML_F32: dt = OG_DTYPE_F32; break;
    case OG_GGML_F16: dt = OG_DTYPE_F16; break;
    case OG_GGML_BF16: dt = OG_DTYPE_BF16; break;
    case OG_GGML_Q8_0: dt = OG_DTYPE_Q8; break;
    case OG_GGML_Q4_0: dt = OG_DTYPE_Q4; break;
    default:
        return og_set_error(OG_ERR_UNSUPPORTED,
                            "gguf %s: tensor \"%s\" has type %s: not supported (f32, f16, bf16, q8_0, q4_0)", s->path, gname,
                            og_ggml_type_name(g->type));
    }
    if (s->n == s->cap) return og_set_error(OG_ERR_STATE, "export: more GGUF tensors than planned (%d)", s->cap);
    gmap *m = &s->maps[s->n++];
    memset(m, 0, sizeof *m);
    snprintf(m->hf_name, sizeof m->hf_name, "%s", hf_name);
    m->g = g;
    m->row0 = e * n;
    m->t = (og_st_tensor){.name = m->hf_name, .dtype = dt, .rank = 2, .shape = {n, K}, .numel = n * K,
                          .data = g->data, .nbytes = g->nbytes, .file = s->path};
    return OG_OK;
}

/* The last tensor mapped, its values changed back by x (read as f32). */
static void set_xform(gsrc *s, gxform x) {
    s->maps[s->n - 1].xform = x;
    s->maps[s->n - 1].t.dtype = OG_DTYPE_F32;
}

/* gname [2 take x groups rows, K] as hf_name [take x groups, K]: of each
 * group of 2 take rows, the take rows from off (qwen3next's ssm_ba). */
static og_status map_half_rows(gsrc *s, const char *gname, const char *hf_name, int64_t groups, int64_t take,
                               int64_t off, int64_t K) {
    OG_TRY(map_tensor(s, gname, hf_name, 2, 2 * take * groups, K, 0, false, NULL));
    gmap *m = &s->maps[s->n - 1];
    m->take = take;
    m->group = 2 * take;
    m->off = off;
    m->t.shape[0] = take * groups;
    m->t.numel = take * groups * K;
    return OG_OK;
}

/* A causal convolution's kernel stored squeezed (ne [K, C]) as the
 * checkpoint's conv1d.weight [C, 1, K]. */
static og_status map_conv(gsrc *s, const char *gname, const char *hf_name, int64_t C, int64_t K) {
    OG_TRY(map_tensor(s, gname, hf_name, 2, C, K, 0, false, NULL));
    gmap *m = &s->maps[s->n - 1];
    m->t.rank = 3;
    m->t.shape[0] = C;
    m->t.shape[1] = 1;
    m->t.shape[2] = K;
    return OG_OK;
}

/* ------------------------------------------------------------ hyperparameters */

typedef struct arch_info {
    const char *name;
    og_hf_family family;
} arch_info;

static const arch_info k_archs[] = {
    {"llama", OG_HF_LLAMA},         {"qwen2", OG_HF_QWEN2},          {"qwen3", OG_HF_QWEN3},
    {"qwen3moe", OG_HF_QWEN3_MOE}, {"qwen3next", OG_HF_QWEN3_NEXT}};

static og_status arch_int(const og_gguf *g, const char *arch, const char *key, bool required, int64_t lo, int64_t hi,
                          int64_t def, int64_t *out) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    *out = def;
    return og_gguf_get_int(g, full, required, lo, hi, out, NULL);
}

/* An f32 value as the decimal number it was most likely written from: the
 * shortest decimal form that reads back as the same float (1e-5f -> 1e-5),
 * so that values a config gave in decimal (rms eps, rope theta) come out
 * as the double the Hugging Face config holds. */
static double f32_decimal(double f) {
    char buf[64];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, f);
        if ((float)strtod(buf, NULL) == (float)f) return strtod(buf, NULL);
    }
    return f;
}

static og_status arch_float(const og_gguf *g, const char *arch, const char *key, double def, double *out) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    *out = def;
    og_status rc = og_gguf_get_float(g, full, false, out, NULL);
    const og_gguf_kv *kv = og_gguf_find_kv(g, full);
    if (rc == OG_OK && kv && kv->type == OG_GGUF_F32) *out = f32_decimal(*out);
    if (rc == OG_OK && !(isfinite(*out) && *out > 0))
        return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\" = %g: must be a positive number", og_gguf_origin(g),
                            full, *out);
    return rc;
}

/* llama3 rope scaling as llama.cpp's converter stores it: one factor per
 * rotary frequency (rope_freqs.weight, f32). The factors depend on the
 * original context only through original/low and original/high; with the
 * low 1 / high 4 every Llama 3 model uses, original follows from any factor
 * strictly between 1 and factor, and every factor is checked against the
 * formula. */
static og_status rope_from_freqs(const og_gguf *g, const og_gguf_tensor *t, og_hf_config *c) {
    const char *path = og_gguf_origin(g);
    const int64_t n = c->head_dim / 2;
    if (t->type != OG_GGML_F32 || t->n_dims != 1 || t->ne[0] != n)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"rope_freqs.weight\" must be f32 [%lld]", path,
                            (long long)n);
    const float *r = t->data;
    double factor = 1;
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, &r[i], 4);
        if (!(isfinite(v) && v >= 1.0f))
            return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: tensor \"rope_freqs.weight\"[%lld] = %g: factors below 1 "
                                "are not llama3 rope scaling (not supported)", path, (long long)i, (double)v);
        if (v > factor) factor = v;
    }
    if (factor == 1) return OG_OK; /* no scaling at all */
    const double low = 1, high = 4;
    double orig = 0;
    for (int64_t i = 0; i < n && orig == 0; i++) {
        float v;
        memcpy(&v, &r[i], 4);
        if (v > 1.0f && v < (float)factor) {
            double freq = 1.0 / pow(c->rope.theta, (double)(2 * i) / (double)c->head_dim);
            double wavelen = 2 * OG_PI / freq;
            double smooth = (1.0 / v - 1.0 / factor) / (1.0 - 1.0 / factor);
            orig = nearbyint(wavelen * (smooth * (high - low) + low));
        }
    }
    if (orig == 0) orig = nearbyint((double)c->max_position_embeddings / factor); /* every factor 1 or factor */
    if (!(orig >= 1 && orig <= INT32_MAX))
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: tensor \"rope_freqs.weight\": no llama3 original context "
                            "fits its factors", path);
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, &r[i], 4);
        double freq = 1.0 / pow(c->rope.theta, (double)(2 * i) / (double)c->head_dim);
        double wavelen = 2 * OG_PI / freq, want;
        if (wavelen < orig / high) want = 1;
        else if (wavelen > orig / low) want = factor;
        else {
            double smooth = (orig / wavelen - low) / (high - low);
            want = 1 / ((1 - smooth) / factor + smooth);
        }
        if (fabs(want - v) > 1e-5 * want)
            return og_set_error(OG_ERR_UNSUPPORTED,
                                "gguf %s: tensor \"rope_freqs.weight\"[%lld] = %.9g, llama3 rope scaling with factor "
                                "%g, low_freq_factor 1, high_freq_factor 4 and original context %.0f gives %.9g: "
                                "other per-frequency rope factors are not supported",
                                path, (long long)i, (double)v, factor, orig, want);
    }
    c->rope.type = OG_ROPE_LLAMA3;
    c->rope.factor = factor;
    c->rope.low_freq_factor = low;
    c->rope.high_freq_factor = high;
    c->rope.original_max_position_embeddings = (int64_t)orig;
    return OG_OK;
}

/* qwen3next's Gated DeltaNet geometry and layer kinds. A layer is linear
 * where it has blk.N.ssm_a; full_attention_interval, which llama.cpp reads
 * the kinds from, must agree. */
static og_status read_hybrid(const og_gguf *g, const char *arch, og_hf_config *c) {
    const char *path = og_gguf_origin(g);
    int64_t K, dk, hk, hv, inner, rot, every;
    og_status rc;
    if ((rc = arch_int(g, arch, "ssm.conv_kernel", true, 2, 64, 0, &K)) ||
        (rc = arch_int(g, arch, "ssm.state_size", true, 1, OG_MAX_STATE_HEAD_DIM, 0, &dk)) ||
        (rc = arch_int(g, arch, "ssm.group_count", true, 1, OG_MAX_STATE_HEADS, 0, &hk)) ||
        (rc = arch_int(g, arch, "ssm.time_step_rank", true, 1, OG_MAX_STATE_HEADS, 0, &hv)) ||
        (rc = arch_int(g, arch, "ssm.inner_size", true, 1, (int64_t)OG_MAX_STATE_HEADS * OG_MAX_STATE_HEAD_DIM, 0,
                       &inner)) ||
        (rc = arch_int(g, arch, "full_attention_interval", false, 1, INT32_MAX, 0, &every)) ||
        (rc = arch_int(g, arch, "rope.dimension_count", true, 2, c->head_dim, 0, &rot)))
        return rc;
    if (hv % hk || inner % hv)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: %s.ssm.time_step_rank %lld (value heads) must be a multiple of "
                            "ssm.group_count %lld and divide ssm.inner_size %lld", path, arch, (long long)hv,
                            (long long)hk, (long long)inner);
    if (rot % 2)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: %s.rope.dimension_count %lld must be even", path, arch,
                            (long long)rot);
    c->linear_conv_kernel = (int32_t)K;
    c->linear_k_head_dim = (int32_t)dk;
    c->linear_k_heads = (int32_t)hk;
    c->linear_v_heads = (int32_t)hv;
    c->linear_v_head_dim = (int32_t)(inner / hv);
    c->rotary_dim = (int32_t)rot;
    for (int32_t i = 0; i < c->num_hidden_layers; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ssm_a", i);
        c->layer_linear[i] = og_gguf_find_tensor(g, name) != NULL;
        c->n_linear_layers += c->layer_linear[i];
        if (every && c->layer_linear[i] != ((i + 1) % every != 0))
            return og_set_error(OG_ERR_FORMAT, "gguf %s: layer %d is %s, which %s.full_attention_interval = %lld "
                                "contradicts", path, i, c->layer_linear[i] ? "linear (it has ssm_a)" :
                                "full attention (it has no ssm_a)", arch, (long long)every);
    }
    c->norm_plus_one = c->attn_output_gate = c->split_in_proj = true;
    return OG_OK;
}

static og_status read_hparams(const og_gguf *g, og_hf_config *c, char *arch, size_t arch_cap) {
    const char *path = og_gguf_origin(g);
    char *a = NULL;
    og_status rc = og_gguf_get_str(g, "general.architecture", true, &a, NULL);
    if (rc != OG_OK) return rc;
    snprintf(arch, arch_cap, "%s", a);
    og_free(a);
    memset(c, 0, sizeof *c);
    size_t k = 0;
    while (k < sizeof k_archs / sizeof k_archs[0] && strcmp(k_archs[k].name, arch)) k++;
    if (k == sizeof k_archs / sizeof k_archs[0])
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key \"general.architecture\" = \"%s\": not supported (llama, qwen2, "
                            "qwen3, qwen3moe, qwen3next)",
                            path, arch);
    c->family = k_archs[k].family;
    int64_t v;
    const bool moe = c->family == OG_HF_QWEN3_MOE || c->family == OG_HF_QWEN3_NEXT;
    if (moe) {
        /* llama.cpp's qwen3moe / qwen3next: softmax router, top
         * expert_used_count of expert_count, weights renormalised (it always
         * normalises them); qwen3next's gated shared expert */
        int64_t ne, nu;
        if ((rc = arch_int(g, arch, "expert_count", true, 1, OG_MAX_EXPERTS, 0, &ne)) ||
            (rc = arch_int(g, arch, "expert_used_count", true, 1, ne < 64 ? ne : 64, 0, &nu)) ||
            (rc = arch_int(g, arch, "expert_feed_forward_length", true, 1, OG_MAX_INTERMEDIATE, 0,
                           &c->moe_intermediate_size)))
            return rc;
        c->num_experts = (int32_t)ne;
        c->num_experts_per_tok = (int32_t)nu;
        c->norm_topk_prob = true;
        if ((rc = arch_int(g, arch, "expert_shared_feed_forward_length", false, 0, OG_MAX_INTERMEDIATE, 0,
                           &c->shared_expert_intermediate_size)))
            return rc;
    }
    if ((rc = arch_int(g, arch, "embedding_length", true, 1, OG_MAX_HIDDEN, 0, &c->hidden_size)) ||
        (rc = arch_int(g, arch, "feed_forward_length", !moe, 1, OG_MAX_INTERMEDIATE, c->moe_intermediate_size,
                       &c->intermediate_size)) ||
        (rc = arch_int(g, arch, "block_count", true, 1, OG_HF_MAX_LAYERS, 0, &v)))
        return rc;
    c->num_hidden_layers = (int32_t)v;
    if ((rc = arch_int(g, arch, "attention.head_count", true, 1, OG_MAX_HEADS, 0, &v))) return rc;
    c->num_attention_heads = (int32_t)v;
    if ((rc = arch_int(g, arch, "attention.head_count_kv", false, 1, OG_MAX_HEADS, c->num_attention_heads, &v)))
        return rc;
    c->num_key_value_heads = (int32_t)v;
    if (c->num_attention_heads % c->num_key_value_heads)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s.attention.head_count_kv\" = %d: must divide head_count %d",
                            path, arch, c->num_key_value_heads, c->num_attention_heads);
    int64_t def_hd = c->hidden_size / c->num_attention_heads, vd;
    if ((rc = arch_int(g, arch, "attention.key_length", false, 2, OG_MAX_HEAD_DIM, def_hd, &v)) ||
        (rc = arch_int(g, arch, "attention.value_length", false, 2, OG_MAX_HEAD_DIM, v, &vd)))
        return rc;
    if (v != vd)
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key_length %lld != value_length %lld: not supported", path,
                            (long long)v, (long long)vd);
    if (v < 2 || v % 2 || v > OG_MAX_HEAD_DIM)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: head dimension %lld must be even and in [2, %d]", path,
                            (long long)v, OG_MAX_HEAD_DIM);
    c->head_dim = (int32_t)v;
    if ((int64_t)c->num_attention_heads * c->head_dim > OG_MAX_ATTN_WIDTH)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: head_count %d x head dimension %d is over this build's limit %lld",
                            path, c->num_attention_heads, c->head_dim, (long long)OG_MAX_ATTN_WIDTH);
    if ((rc = arch_float(g, arch, "attention.layer_norm_rms_epsilon", 1e-6, &c->rms_norm_eps)) ||
        (rc = arch_int(g, arch, "context_length", true, 1, INT32_MAX, 0, &c->max_position_embeddings)))
        return rc;
    c->rope.type = OG_ROPE_DEFAULT;
    c->rope.factor = 1;
    if ((rc = arch_float(g, arch, "rope.freq_base", 10000.0, &c->rope.theta))) return rc;
    char key[128], *st = NULL;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if ((rc = og_gguf_get_str(g, key, false, &st, NULL))) return rc;
    if (st && strcmp(st, "none")) {
        bool linear = !strcmp(st, "linear");
        if (!linear)
            rc = og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key \"%s\" = \"%s\": not supported (none, linear)", path,
                              key, st);
        og_free(st);
        if (rc) return rc;
        c->rope.type = OG_ROPE_LINEAR;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if ((rc = arch_float(g, arch, "rope.scaling.factor", 1.0, &c->rope.factor))) return rc;
        if (!(isfinite(c->rope.factor) && c->rope.factor > 0))
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s\" = %g: must be a positive number", path, key,
                                c->rope.factor);
    } else {
        og_free(st);
    }
    const og_gguf_tensor *rf = og_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) {
        if (c->rope.type != OG_ROPE_DEFAULT)
            return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: both rope_freqs.weight and %s.rope.scaling.type: not supported",
                                path, arch);
        if ((rc = rope_from_freqs(g, rf, c))) return rc;
    }
    /* sliding window: <arch>.attention.sliding_window with a per-layer
     * pattern (bool array, true = sliding); without a pattern every layer */
    int64_t window = 0;
    if ((rc = arch_int(g, arch, "attention.sliding_window", false, 0, INT32_MAX, 0, &window))) return rc;
    c->sliding_window = (int32_t)window;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", arch);
    const og_gguf_kv *pat = og_gguf_find_kv(g, key);
    if (pat && (pat->type != OG_GGUF_ARRAY || pat->elem_type != OG_GGUF_BOOL ||
                pat->count != (uint64_t)c->num_hidden_layers))
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key \"%s\" must be an array of %d bools (other forms are not "
                            "supported)", path, key, c->num_hidden_layers);
    for (int32_t i = 0; i < c->num_hidden_layers; i++)
        c->layer_sliding[i] = window > 0 && (!pat || pat->elems[i]);
    c->qk_norm = c->family == OG_HF_QWEN3 || moe;
    return c->family == OG_HF_QWEN3_NEXT ? read_hybrid(g, arch, c) : OG_OK;
}

/* ------------------------------------------------------------ tokenizer */

/* The pre-tokenizer regexes of tokenizer.ggml.pre names, as the Hugging
 * Face tokenizer.json files of those model families write them. */
#define RE_LLAMA3                                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static cJSON *byte_level(bool use_regex) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", false);
    cJSON_AddBoolToObject(o, "trim_offsets", true);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

static cJSON *split_then_bytes(const char *regex) {
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_CreateArray(), *split = cJSON_CreateObject(),
          *pat = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(pat, "Regex", regex);
    cJSON_AddItemToObject(split, "pattern", pat);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", false);
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, byte_level(false));
    cJSON_AddItemToObject(seq, "pretokenizers", list);
    return seq;
}

/* The token text of id, NUL-terminated in buf-sized storage it allocates. */
static og_status token_text(const og_gguf *g, const og_gguf_kv *tokens, uint64_t id, char **out) {
    og_gguf_str s = tokens->strs[id];
    if (memchr(s.p, 0, (size_t)s.len))
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: token %llu contains a NUL byte: not supported",
                            og_gguf_origin(g), (unsigned long long)id);
    *out = og_malloc((size_t)s.len + 1);
    if (!*out) return og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
    memcpy(*out, s.p, (size_t)s.len);
    (*out)[s.len] = 0;
    return OG_OK;
}

static og_status special_id(const og_gguf *g, const char *key, uint64_t n_tokens, int64_t *id) {
    *id = -1;
    return og_gguf_get_int(g, key, false, 0, (int64_t)n_tokens - 1, id, NULL);
}

/* ---- SentencePiece ("llama") vocabularies
 *
 * A SentencePiece BPE model is a list of scored pieces: encoding starts
 * from characters and repeatedly joins the adjacent pair whose join is a
 * piece of the highest score. That is a merges list: (a, b) for every
 * normal piece split into two normal pieces a and b, ranked by the score of
 * the whole piece (higher first), ties by the piece's id, then the ids of
 * a and b, which is the list Hugging Face's converter derives from a
 * SentencePiece model. A Unigram model stores the same keys; its scores are
 * log probabilities, not merge priorities, and no key tells the two apart:
 * a "llama" vocabulary is read as BPE. SentencePiece's BPE trainer scores
 * piece i as -i, whole numbers; a Unigram model's log probabilities are
 * not, so a normal piece with a fractional score is refused as a likely
 * Unigram model rather than tokenized wrongly. */

#define SPM_SPACE "\xE2\x96\x81" /* U+2581, SentencePiece's space */

typedef struct piece_map {
    const og_gguf_str *strs;
    uint32_t *slot; /* id + 1; 0 empty */
    uint64_t mask;
} piece_map;

static uint64_t piece_hash(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

static int64_t piece_find(const piece_map *m, const char *p, uint64_t n) {
    for (uint64_t k = piece_hash(p, n) & m->mask;; k = (k + 1) & m->mask) {
        uint32_t s = m->slot[k];
        if (!s) return -1;
        const og_gguf_str *e = &m->strs[s - 1];
        if ((uint64_t)e->len == n && !memcmp(e->p, p, (size_t)n)) return s - 1;
    }
}

typedef struct spm_merge {
    float score;
    int32_t id, left, right;
} spm_merge;

static int cmp_spm_merge(const void *pa, const void *pb) {
    const spm_merge *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    if (a->left != b->left) return a->left < b->left ? -1 : 1;
    return (a->right > b->right) - (a->right < b->right);
}

/* The merges of a scored vocabulary into mlist as ["a", "b"] pairs;
 * normal[i] says whether token i is a normal piece (the only ones BPE
 * joins). */
static og_status spm_merges(const og_gguf *g, const og_gguf_kv *tokens, const uint8_t *normal, const float *scores,
                            cJSON *mlist) {
    const char *path = og_gguf_origin(g);
    const uint64_t n = tokens->count;
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    piece_map m = {.strs = tokens->strs, .slot = og_calloc((size_t)cap, sizeof(uint32_t)), .mask = cap - 1};
    spm_merge *list = NULL;
    size_t count = 0, lcap = 0;
    og_status rc = m.slot ? OG_OK : og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
    for (uint64_t i = 0; i < n && rc == OG_OK; i++) {
        if (!normal[i]) continue;
        const og_gguf_str *t = &tokens->strs[i];
        int64_t dup = piece_find(&m, t->p, (uint64_t)t->len);
        if (dup >= 0) {
            rc = og_set_error(OG_ERR_FORMAT, "gguf %s: key \"tokenizer.ggml.tokens\"[%llu] repeats token %lld: a "
                              "SentencePiece vocabulary has each piece once", path, (unsigned long long)i,
                              (long long)dup);
            break;
        }
        uint64_t k = piece_hash(t->p, (uint64_t)t->len) & m.mask;
        while (m.slot[k]) k = (k + 1) & m.mask;
        m.slot[k] = (uint32_t)(i + 1);
    }
    for (uint64_t i = 0; i < n && rc == OG_OK; i++) {
        if (!normal[i]) continue;
        const og_gguf_str *t = &tokens->strs[i];
        /* every split at a character boundary (UTF-8 continuation bytes
         * never start a piece) */
        for (uint64_t k = 1; k < (uint64_t)t->len && rc == OG_OK; k++) {
            if (((uint8_t)t->p[k] & 0xC0) == 0x80) continue;
            int64_t l = piece_find(&m, t->p, k), r = l < 0 ? -1 : piece_find(&m, t->p + k, (uint64_t)t->len - k);
            if (r < 0) continue;
            if (count == lcap) {
                size_t ncap = lcap ? lcap * 2 : 1024;
                spm_merge *nl = og_realloc(list, ncap * sizeof *nl);
                if (!nl) {
                    rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
                    break;
                }
                list = nl;
                lcap = ncap;
            }
            list[count++] = (spm_merge){scores[i], (int32_t)i, (int32_t)l, (int32_t)r};
        }
    }
    if (rc == OG_OK && count) qsort(list, count, sizeof *list, cmp_spm_merge);
    for (size_t k = 0; k < count && rc == OG_OK; k++) {
        char *a = NULL, *b = NULL;
        if ((rc = token_text(g, tokens, (uint64_t)list[k].left, &a)) == OG_OK &&
            (rc = token_text(g, tokens, (uint64_t)list[k].right, &b)) == OG_OK) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(a));
            cJSON_AddItemToArray(pair, cJSON_CreateString(b));
            cJSON_AddItemToArray(mlist, pair);
        }
        og_free(a);
        og_free(b);
    }
    og_free(list);
    og_free(m.slot);
    return rc;
}

/* The normalizer and decoders of a SentencePiece vocabulary, as
 * SentencePiece and llama.cpp run it: spaces become U+2581 and one is put
 * in front of every piece of text (add_space_prefix), even one that starts
 * with a space, and after a special token written in the text, the text is
 * one word (no pre-tokenizer); decoding turns U+2581 back into spaces,
 * <0xNN> pieces into bytes and drops the one space put in front. (Hugging
 * Face's non-legacy Metaspace form puts no second U+2581 before a leading
 * space, and none after a special token: not what the model was trained
 * on.) */
static void spm_pipeline(cJSON *root, bool space_prefix) {
    cJSON *norm = cJSON_CreateObject(), *nlist = cJSON_CreateArray(), *space = cJSON_CreateObject(),
          *spat = cJSON_CreateObject();
    cJSON_AddStringToObject(norm, "type", "Sequence");
    if (space_prefix) {
        cJSON *pre = cJSON_CreateObject();
        cJSON_AddStringToObject(pre, "type", "Prepend");
        cJSON_AddStringToObject(pre, "prepend", SPM_SPACE);
        cJSON_AddItemToArray(nlist, pre);
    }
    cJSON_AddStringToObject(space, "type", "Replace");
    cJSON_AddStringToObject(spat, "String", " ");
    cJSON_AddItemToObject(space, "pattern", spat);
    cJSON_AddStringToObject(space, "content", SPM_SPACE);
    cJSON_AddItemToArray(nlist, space);
    cJSON_AddItemToObject(norm, "normalizers", nlist);
    cJSON_ReplaceItemInObjectCaseSensitive(root, "normalizer", norm);
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_CreateNull());
    cJSON *dec = cJSON_CreateObject(), *list = cJSON_CreateArray(), *rep = cJSON_CreateObject(),
          *pat = cJSON_CreateObject(), *bf = cJSON_CreateObject(), *fuse = cJSON_CreateObject();
    cJSON_AddStringToObject(dec, "type", "Sequence");
    cJSON_AddStringToObject(rep, "type", "Replace");
    cJSON_AddStringToObject(pat, "String", SPM_SPACE);
    cJSON_AddItemToObject(rep, "pattern", pat);
    cJSON_AddStringToObject(rep, "content", " ");
    cJSON_AddItemToArray(list, rep);
    cJSON_AddStringToObject(bf, "type", "ByteFallback");
    cJSON_AddItemToArray(list, bf);
    cJSON_AddStringToObject(fuse, "type", "Fuse");
    cJSON_AddItemToArray(list, fuse);
    if (space_prefix) {
        cJSON *strip = cJSON_CreateObject();
        cJSON_AddStringToObject(strip, "type", "Strip");
        cJSON_AddStringToObject(strip, "content", " ");
        cJSON_AddNumberToObject(strip, "start", 1);
        cJSON_AddNumberToObject(strip, "stop", 0);
        cJSON_AddItemToArray(list, strip);
    }
    cJSON_AddItemToObject(dec, "decoders", list);
    cJSON_AddItemToObject(root, "decoder", dec);
}

/* The checks only a SentencePiece vocabulary needs: scores, the
 * normalization keys it cannot honour, byte pieces spelled <0xNN>. */
static og_status spm_check(const og_gguf *g, const og_gguf_kv *tokens, const og_gguf_kv *types, const og_gguf_kv **scores,
                           bool *space_prefix) {
    const char *path = og_gguf_origin(g);
    *scores = og_gguf_find_kv(g, "tokenizer.ggml.scores");
    const og_gguf_kv *s = *scores;
    if (!s || s->type != OG_GGUF_ARRAY || s->elem_type != OG_GGUF_F32 || s->count != tokens->count)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"tokenizer.ggml.scores\" must be an array of f32, one per token "
                            "(%llu tokens, %s %llu)", path, (unsigned long long)tokens->count,
                            s ? "scores has" : "scores is missing:", s ? (unsigned long long)s->count : 0ull);
    for (uint64_t i = 0; i < s->count; i++) {
        float v;
        int32_t type = TOK_NORMAL;
        memcpy(&v, s->elems + i * 4, 4);
        if (types) memcpy(&type, types->elems + i * 4, 4);
        if (!isfinite(v))
            return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"tokenizer.ggml.scores\"[%llu] is not a finite number",
                                path, (unsigned long long)i);
        if ((type == TOK_NORMAL || type == 0) && v != floorf(v))
            return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key \"tokenizer.ggml.scores\"[%llu] = %g is not a whole "
                                "number: the scores look like a SentencePiece Unigram model's log probabilities, and "
                                "only SentencePiece BPE (scores -0, -1, -2, ...) is supported", path,
                                (unsigned long long)i, (double)v);
    }
    const og_gguf_kv *cm = og_gguf_find_kv(g, "tokenizer.ggml.precompiled_charsmap");
    if (cm && !(cm->type == OG_GGUF_ARRAY && cm->count == 0) && !(cm->type == OG_GGUF_STRING && cm->s.len == 0))
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key \"tokenizer.ggml.precompiled_charsmap\": a SentencePiece "
                            "normalization table is not supported", path);
    bool on = false, found = false;
    og_status rc = og_gguf_get_bool(g, "tokenizer.ggml.remove_extra_whitespaces", false, &on, &found);
    if (rc == OG_OK && on)
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: key \"tokenizer.ggml.remove_extra_whitespaces\" = true: not "
                            "supported", path);
    *space_prefix = true;
    if (rc == OG_OK) rc = og_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", false, space_prefix, &found);
    for (uint64_t i = 0; types && i < tokens->count && rc == OG_OK; i++) {
        int32_t type;
        memcpy(&type, types->elems + i * 4, 4);
        const og_gguf_str *t = &tokens->strs[i];
        static const char hex[] = "0123456789ABCDEF";
        if (type == TOK_BYTE && !(t->len == 6 && !memcmp(t->p, "<0x", 3) && strchr(hex, t->p[3]) && t->p[3] &&
                                  strchr(hex, t->p[4]) && t->p[4] && t->p[5] == '>'))
            rc = og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: token %llu has type byte but is not spelled <0xNN>: not "
                              "supported", path, (unsigned long long)i);
    }
    return rc;
}

og_status og_gguf_tokenizer(const og_gguf *g, char **tok_json, char **tok_config) {
    const char *path = og_gguf_origin(g);
    *tok_json = *tok_config = NULL;
    char *model = NULL, *pre = NULL;
    bool found = false;
    og_status rc = og_gguf_get_str(g, "tokenizer.ggml.model", false, &model, &found);
    if (rc != OG_OK || !found) return rc; /* no tokenizer */
    if (!strcmp(model, "no_vocab")) { /* a file written without one (benchmark files) */
        og_free(model);
        return OG_OK;
    }
    const bool spm = !strcmp(model, "llama");
    if (!spm && strcmp(model, "gpt2")) {
        rc = og_set_error(OG_ERR_UNSUPPORTED,
                          "gguf %s: key \"tokenizer.ggml.model\" = \"%s\": not supported (gpt2: byte-level BPE, llama: "
                          "SentencePiece BPE, no_vocab: none)", path, model);
        og_free(model);
        return rc;
    }
    og_free(model);
    if (!spm && (rc = og_gguf_get_str(g, "tokenizer.ggml.pre", false, &pre, &found))) return rc;
    const og_gguf_kv *tokens = og_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const og_gguf_kv *merges = og_gguf_find_kv(g, "tokenizer.ggml.merges");
    const og_gguf_kv *types = og_gguf_find_kv(g, "tokenizer.ggml.token_type");
    const og_gguf_kv *scores = NULL;
    const char *which = NULL;
    if (!tokens || tokens->type != OG_GGUF_ARRAY || tokens->elem_type != OG_GGUF_STRING || tokens->count == 0)
        which = "tokenizer.ggml.tokens\" must be a non-empty array of strings";
    else if (tokens->count > OG_MAX_VOCAB)
        which = "tokenizer.ggml.tokens\" has more tokens than this build supports";
    else if (!spm && (!merges || merges->type != OG_GGUF_ARRAY || merges->elem_type != OG_GGUF_STRING))
        which = "tokenizer.ggml.merges\" must be an array of strings";
    else if (types && (types->type != OG_GGUF_ARRAY || types->elem_type != OG_GGUF_I32 || types->count != tokens->count))
        which = "tokenizer.ggml.token_type\" must be an array of i32, one per token";
    if (which) {
        og_free(pre);
        return og_set_error(OG_ERR_FORMAT, "gguf %s: key \"%s", path, which);
    }
    bool space_prefix = true;
    if (spm && (rc = spm_check(g, tokens, types, &scores, &space_prefix))) return rc;
    cJSON *pt = NULL, *norm = NULL;
    const char *pname = pre ? pre : "default";
    if (spm) {
        /* the pipeline is added below */
    } else if (!strcmp(pname, "default") || !strcmp(pname, "gpt-2")) {
        pt = byte_level(true);
    } else if (!strcmp(pname, "llama-bpe") || !strcmp(pname, "llama3")) {
        pt = split_then_bytes(RE_LLAMA3);
    } else if (!strcmp(pname, "qwen2")) {
        pt = split_then_bytes(RE_QWEN2);
        norm = cJSON_CreateObject();
        cJSON_AddStringToObject(norm, "type", "NFC");
    } else {
        rc = og_set_error(OG_ERR_UNSUPPORTED,
                          "gguf %s: key \"tokenizer.ggml.pre\" = \"%s\": pre-tokenizer not supported (default, gpt-2, "
                          "llama-bpe, qwen2)", path, pname);
        og_free(pre);
        return rc;
    }
    og_free(pre);

    cJSON *root = cJSON_CreateObject(), *added = cJSON_CreateArray(), *bpe = cJSON_CreateObject(),
          *vocab = cJSON_CreateObject(), *mlist = cJSON_CreateArray(), *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON_AddItemToObject(root, "normalizer", norm ? norm : cJSON_CreateNull());
    cJSON_AddItemToObject(root, "post_processor", cJSON_CreateNull());
    if (spm) {
        spm_pipeline(root, space_prefix);
    } else {
        cJSON_AddItemToObject(root, "pre_tokenizer", pt);
        cJSON_AddItemToObject(root, "decoder", byte_level(true));
    }
    cJSON_AddStringToObject(bpe, "type", "BPE");
    cJSON_AddItemToObject(bpe, "unk_token", cJSON_CreateNull());
    cJSON_AddBoolToObject(bpe, "fuse_unk", spm);
    cJSON_AddBoolToObject(bpe, "byte_fallback", spm);
    cJSON_AddBoolToObject(bpe, "ignore_merges", false);
    cJSON_AddItemToObject(bpe, "vocab", vocab);
    cJSON_AddItemToObject(bpe, "merges", mlist);
    cJSON_AddItemToObject(root, "model", bpe);
    /* SentencePiece: only normal pieces take part in merges; the unknown
     * piece is a special token, as SentencePiece and llama.cpp match it in
     * text like the control tokens */
    uint8_t *normal = spm ? og_calloc((size_t)tokens->count, 1) : NULL;
    if (spm && !normal) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
    int64_t unk_id = -1;
    for (uint64_t i = 0; i < tokens->count && rc == OG_OK; i++) {
        int32_t type = TOK_NORMAL;
        if (types) memcpy(&type, types->elems + i * 4, 4);
        if (type == 0) type = TOK_NORMAL; /* "undefined" in llama.cpp: an ordinary token */
        if (type == TOK_UNUSED) continue; /* padding rows of the embedding */
        if (normal) normal[i] = type == TOK_NORMAL;
        if (type == TOK_UNKNOWN && unk_id < 0) unk_id = (int64_t)i;
        char *text = NULL;
        if ((rc = token_text(g, tokens, i, &text))) break;
        cJSON_AddNumberToObject(vocab, text, (double)i);
        if (type == TOK_CONTROL || type == TOK_USER_DEFINED || (spm && type == TOK_UNKNOWN)) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", text);
            cJSON_AddBoolToObject(a, "single_word", false);
            cJSON_AddBoolToObject(a, "lstrip", false);
            cJSON_AddBoolToObject(a, "rstrip", false);
            cJSON_AddBoolToObject(a, "normalized", false);
            cJSON_AddBoolToObject(a, "special", type != TOK_USER_DEFINED);
            cJSON_AddItemToArray(added, a);
        } else if (type != TOK_NORMAL && type != TOK_BYTE && type != TOK_UNKNOWN) {
            rc = og_set_error(OG_ERR_FORMAT, "gguf %s: key \"tokenizer.ggml.token_type\"[%llu] = %d: not a token type",
                              path, (unsigned long long)i, type);
        }
        og_free(text);
    }
    if (spm && rc == OG_OK) {
        float *sc = og_malloc((size_t)tokens->count * sizeof *sc);
        if (!sc) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
        else memcpy(sc, scores->elems, (size_t)tokens->count * sizeof *sc);
        if (rc == OG_OK) rc = spm_merges(g, tokens, normal, sc, mlist);
        og_free(sc);
        int64_t key_unk = -1; /* the key wins over the first piece typed unknown */
        if (rc == OG_OK) rc = special_id(g, "tokenizer.ggml.unknown_token_id", tokens->count, &key_unk);
        if (key_unk >= 0) unk_id = key_unk;
        if (rc == OG_OK && unk_id >= 0) {
            char *text = NULL;
            if ((rc = token_text(g, tokens, (uint64_t)unk_id, &text)) == OG_OK)
                cJSON_ReplaceItemInObjectCaseSensitive(bpe, "unk_token", cJSON_CreateString(text));
            og_free(text);
        }
    }
    og_free(normal);
    for (uint64_t i = 0; !spm && i < merges->count && rc == OG_OK; i++) {
        og_gguf_str m = merges->strs[i];
        const char *sp = memchr(m.p, ' ', (size_t)m.len);
        if (!sp || memchr(m.p, 0, (size_t)m.len) || memchr(sp + 1, ' ', (size_t)(m.p + m.len - sp - 1))) {
            rc = og_set_error(OG_ERR_FORMAT, "gguf %s: key \"tokenizer.ggml.merges\"[%llu] is not two tokens separated "
                              "by one space", path, (unsigned long long)i);
            break;
        }
        char *text = og_malloc((size_t)m.len + 1);
        if (!text) {
            rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
            break;
        }
        memcpy(text, m.p, (size_t)m.len);
        text[m.len] = 0;
        cJSON_AddItemToArray(mlist, cJSON_CreateString(text));
        og_free(text);
    }
    /* tokenizer_config.json: special tokens by text, add_bos/eos, template */
    static const struct {
        const char *key, *field;
    } specials[] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
                    {"tokenizer.ggml.eos_token_id", "eos_token"},
                    {"tokenizer.ggml.unknown_token_id", "unk_token"},
                    {"tokenizer.ggml.padding_token_id", "pad_token"}};
    for (size_t k = 0; k < sizeof specials / sizeof specials[0] && rc == OG_OK; k++) {
        int64_t id;
        if ((rc = special_id(g, specials[k].key, tokens->count, &id)) || id < 0) continue;
        char *text = NULL;
        if ((rc = token_text(g, tokens, (uint64_t)id, &text))) break;
        cJSON_AddStringToObject(cfg, specials[k].field, text);
        og_free(text);
    }
    /* add_bos/add_eos: said in the config, and done by a TemplateProcessing
     * post-processor around the sequence (what encoding with special
     * tokens follows): [bos] A [eos] */
    static const char *const flags[2][3] = {{"tokenizer.ggml.add_bos_token", "add_bos_token", "bos_token"},
                                            {"tokenizer.ggml.add_eos_token", "add_eos_token", "eos_token"}};
    cJSON *single = cJSON_CreateArray(), *specials_obj = cJSON_CreateObject();
    bool any = false;
    for (int k = 0; k < 2 && rc == OG_OK; k++) {
        if (k == 1) { /* the sequence, between bos and eos */
            cJSON *seq = cJSON_CreateObject(), *a = cJSON_CreateObject();
            cJSON_AddStringToObject(a, "id", "A");
            cJSON_AddNumberToObject(a, "type_id", 0);
            cJSON_AddItemToObject(seq, "Sequence", a);
            cJSON_AddItemToArray(single, seq);
        }
        /* a SentencePiece vocabulary without the key adds bos, as llama.cpp does */
        bool on = spm && k == 0;
        if ((rc = og_gguf_get_bool(g, flags[k][0], false, &on, &found)) != OG_OK || (!found && !(spm && k == 0)))
            continue;
        cJSON_AddBoolToObject(cfg, flags[k][1], on);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(cfg, flags[k][2]);
        const cJSON *id = cJSON_IsString(text) ? cJSON_GetObjectItemCaseSensitive(vocab, text->valuestring) : NULL;
        if (!on || !id) continue;
        any = true;
        cJSON *st = cJSON_CreateObject(), *ref = cJSON_CreateObject(), *desc = cJSON_CreateObject(),
              *ids = cJSON_CreateArray(), *toks = cJSON_CreateArray();
        cJSON_AddStringToObject(ref, "id", text->valuestring);
        cJSON_AddNumberToObject(ref, "type_id", 0);
        cJSON_AddItemToObject(st, "SpecialToken", ref);
        cJSON_AddItemToArray(single, st);
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(id->valuedouble));
        cJSON_AddItemToArray(toks, cJSON_CreateString(text->valuestring));
        cJSON_AddStringToObject(desc, "id", text->valuestring);
        cJSON_AddItemToObject(desc, "ids", ids);
        cJSON_AddItemToObject(desc, "tokens", toks);
        cJSON_AddItemToObject(specials_obj, text->valuestring, desc);
    }
    if (any) {
        cJSON *pp = cJSON_CreateObject();
        cJSON_AddStringToObject(pp, "type", "TemplateProcessing");
        cJSON_AddItemToObject(pp, "single", single);
        cJSON_AddItemToObject(pp, "special_tokens", specials_obj);
        cJSON_ReplaceItemInObjectCaseSensitive(root, "post_processor", pp);
    } else {
        cJSON_Delete(single);
        cJSON_Delete(specials_obj);
    }
    char *tpl = NULL;
    if (rc == OG_OK && (rc = og_gguf_get_str(g, "tokenizer.chat_template", false, &tpl, &found)) == OG_OK && found)
        cJSON_AddStringToObject(cfg, "chat_template", tpl);
    og_free(tpl);
    if (rc == OG_OK) {
        char *j = cJSON_PrintUnformatted(root), *c = cJSON_PrintUnformatted(cfg);
        if (j && c) {
            *tok_json = og_strdup(j);
            *tok_config = og_strdup(c);
        }
        if (!*tok_json || !*tok_config) {
            og_free(*tok_json);
            og_free(*tok_config);
            *tok_json = *tok_config = NULL;
            rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "gguf: out of memory");
        }
        cJSON_free(j);
        cJSON_free(c);
    }
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return rc;
}

/* ------------------------------------------------------------ the export */

#define G(suffix) (snprintf(gn, sizeof gn, "blk.%d.%s", i, suffix), gn)
#define HF(suffix) (snprintf(hn, sizeof hn, "model.layers.%d.%s", i, suffix), hn)

/* Layer i's MLP. A layer with a router (ffn_gate_inp) is sparse: its
 * experts' 3-D tensors mapped expert by expert to the per-expert Hugging
 * Face names, and qwen3next's shared expert with its gate; any other layer
 * is dense (*bias: it has ffn_gate.bias). */
static og_status map_mlp(gsrc *s, og_hf_config *c, int32_t i, bool *bias) {
    const int64_t H = c->hidden_size, F = c->intermediate_size;
    char gn[96], hn[96];
    og_status rc;
    c->layer_moe[i] = c->num_experts > 0 && og_gguf_find_tensor(s->g, G("ffn_gate_inp.weight"));
    if (!c->layer_moe[i])
        return (rc = map_tensor(s, G("ffn_gate.weight"), HF("mlp.gate_proj.weight"), 2, F, H, 0, false, NULL)) ||
                       (rc = map_tensor(s, G("ffn_up.weight"), HF("mlp.up_proj.weight"), 2, F, H, 0, false, NULL)) ||
                       (rc = map_tensor(s, G("ffn_down.weight"), HF("mlp.down_proj.weight"), 2, H, F, 0, false, NULL)) ||
                       (rc = map_tensor(s, G("ffn_gate.bias"), HF("mlp.gate_proj.bias"), 1, F, 0, 0, true, bias))
                   ? rc
                   : OG_OK;
    const int64_t E = c->num_experts, FE = c->moe_intermediate_size, S = c->shared_expert_intermediate_size;
    c->n_moe_layers++;
    if ((rc = map_tensor(s, G("ffn_gate_inp.weight"), HF("mlp.gate.weight"), 2, E, H, 0, false, NULL))) return rc;
    static const char *const gnames[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    static const char *const hnames[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int64_t e = 0; e < E; e++)
        for (int j = 0; j < 3; j++) {
            char en[64];
            snprintf(en, sizeof en, "mlp.experts.%lld.%s.weight", (long long)e, hnames[j]);
            if ((rc = map_expert(s, G(gnames[j]), HF(en), e, E, j == 2 ? H : FE, j == 2 ? FE : H))) return rc;
        }
    if (S > 0 &&
        ((rc = map_tensor(s, G("ffn_gate_inp_shexp.weight"), HF("mlp.shared_expert_gate.weight"), 2, 1, H, 0, false,
                          NULL)) ||
         (rc = map_tensor(s, G("ffn_gate_shexp.weight"), HF("mlp.shared_expert.gate_proj.weight"), 2, S, H, 0, false,
                          NULL)) ||
         (rc = map_tensor(s, G("ffn_up_shexp.weight"), HF("mlp.shared_expert.up_proj.weight"), 2, S, H, 0, false, NULL)) ||
         (rc = map_tensor(s, G("ffn_down_shexp.weight"), HF("mlp.shared_expert.down_proj.weight"), 2, H, S, 0, false,
                          NULL))))
        return rc;
    return OG_OK;
}

/* A (1 + w) norm of layer i stored as 1 + w. */
static og_status map_norm_plus_one(gsrc *s, const char *gname, const char *hf_name, int64_t n) {
    OG_TRY(map_tensor(s, gname, hf_name, 1, n, 0, 0, false, NULL));
    set_xform(s, GX_MINUS_ONE);
    return OG_OK;
}

/* Hybrid (qwen3next) layer i, as the converter writes it: norms stored as
 * 1 + w; a linear layer's in_proj_qkvz split into attn_qkv (every q, every
 * k, every v: Qwen3.5's in_proj_qkv) and attn_gate (in_proj_z), in_proj_ba
 * kept as ssm_ba, A_log as ssm_a = -exp(A_log), conv1d squeezed; a full
 * attention layer's q_proj with each head's query and gate rows. */
static og_status map_hybrid_layer(gsrc *s, og_hf_config *c, int32_t i) {
    const int64_t H = c->hidden_size, D = c->head_dim, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
    const int64_t Hk = c->linear_k_heads, Hv = c->linear_v_heads, Dk = c->linear_k_head_dim, Dv = c->linear_v_head_dim;
    const int64_t C = 2 * Hk * Dk + Hv * Dv, r = Hv / Hk;
    char gn[96], hn[96];
    og_status rc;
    bool bias = false;
    if ((rc = map_norm_plus_one(s, G("attn_norm.weight"), HF("input_layernorm.weight"), H)) ||
        (rc = map_norm_plus_one(s, G("post_attention_norm.weight"), HF("post_attention_layernorm.weight"), H)))
        return rc;
    if (c->layer_linear[i]) {
        if ((rc = map_tensor(s, G("attn_qkv.weight"), HF("linear_attn.in_proj_qkv.weight"), 2, C, H, 0, false, NULL)) ||
            (rc = map_tensor(s, G("attn_gate.weight"), HF("linear_attn.in_proj_z.weight"), 2, Hv * Dv, H, 0, false,
                             NULL)) ||
            (rc = map_half_rows(s, G("ssm_ba.weight"), HF("linear_attn.in_proj_b.weight"), Hk, r, 0, H)) ||
            (rc = map_half_rows(s, G("ssm_ba.weight"), HF("linear_attn.in_proj_a.weight"), Hk, r, r, H)) ||
            (rc = map_conv(s, G("ssm_conv1d.weight"), HF("linear_attn.conv1d.weight"), C, c->linear_conv_kernel)) ||
            (rc = map_tensor(s, G("ssm_a"), HF("linear_attn.A_log"), 1, Hv, 0, 0, false, NULL)))
            return rc;
        set_xform(s, GX_LOG_NEG);
        if ((rc = map_tensor(s, G("ssm_dt.bias"), HF("linear_attn.dt_bias"), 1, Hv, 0, 0, false, NULL)) ||
            (rc = map_tensor(s, G("ssm_norm.weight"), HF("linear_attn.norm.weight"), 1, Dv, 0, 0, false, NULL)) ||
            (rc = map_tensor(s, G("ssm_out.weight"), HF("linear_attn.out_proj.weight"), 2, H, Hv * Dv, 0, false, NULL)))
            return rc;
    } else if ((rc = map_tensor(s, G("attn_q.weight"), HF("self_attn.q_proj.weight"), 2, Hq * 2 * D, H, 0, false,
                                NULL)) ||
               (rc = map_tensor(s, G("attn_k.weight"), HF("self_attn.k_proj.weight"), 2, Hkv * D, H, 0, false, NULL)) ||
               (rc = map_tensor(s, G("attn_v.weight"), HF("self_attn.v_proj.weight"), 2, Hkv * D, H, 0, false, NULL)) ||
               (rc = map_tensor(s, G("attn_output.weight"), HF("self_attn.o_proj.weight"), 2, H, Hq * D, 0, false,
                                NULL)) ||
               (rc = map_norm_plus_one(s, G("attn_q_norm.weight"), HF("self_attn.q_norm.weight"), D)) ||
               (rc = map_norm_plus_one(s, G("attn_k_norm.weight"), HF("self_attn.k_norm.weight"), D))) {
        return rc;
    }
    if ((rc = map_mlp(s, c, i, &bias))) return rc;
    return bias ? og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: layer %d has MLP biases: not supported in a %s model",
                               s->path, i, og_hf_family_name(c->family))
                : OG_OK;
}

/* Dense layer i (llama, qwen2, qwen3 and the like): attention with its
 * optional biases and q/k norms, the MLP (map_mlp); every layer's biases as
 * layer 0's. */
static og_status map_dense_layer(gsrc *s, og_hf_config *c, int32_t i) {
    const int64_t H = c->hidden_size, F = c->intermediate_size, D = c->head_dim;
    const int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
    const bool llama = c->family == OG_HF_LLAMA;
    char gn[96], hn[96];
    og_status rc;
    bool qb = false, ob = false, mb = false, qn = false;
    if ((rc = map_tensor(s, G("attn_norm.weight"), HF("input_layernorm.weight"), 1, H, 0, 0, false, NULL)) ||
        (rc = map_tensor(s, G("attn_q.weight"), HF("self_attn.q_proj.weight"), 2, Hq * D, H, llama ? (int32_t)Hq : 0,
                         false, NULL)) ||
        (rc = map_tensor(s, G("attn_k.weight"), HF("self_attn.k_proj.weight"), 2, Hkv * D, H,
                         llama ? (int32_t)Hkv : 0, false, NULL)) ||
        (rc = map_tensor(s, G("attn_v.weight"), HF("self_attn.v_proj.weight"), 2, Hkv * D, H, 0, false, NULL)) ||
        (rc = map_tensor(s, G("attn_output.weight"), HF("self_attn.o_proj.weight"), 2, H, Hq * D, 0, false, NULL)) ||
        (rc = map_tensor(s, G("attn_q.bias"), HF("self_attn.q_proj.bias"), 1, Hq * D, 0, llama ? (int32_t)Hq : 0,
                         c->family != OG_HF_QWEN2, &qb)) ||
        (rc = map_tensor(s, G("attn_output.bias"), HF("self_attn.o_proj.bias"), 1, H, 0, 0, true, &ob)) ||
        (rc = map_tensor(s, G("ffn_norm.weight"), HF("post_attention_layernorm.weight"), 1, H, 0, 0, false, NULL)) ||
        (rc = map_tensor(s, G("attn_q_norm.weight"), HF("self_attn.q_norm.weight"), 1, D, 0, 0, !c->qk_norm, &qn)))
        return rc;
    if ((rc = map_mlp(s, c, i, &mb))) return rc;
    if (i == 0) {
        c->qkv_bias = qb;
        c->o_bias = ob;
        c->mlp_bias = mb;
    } else if (qb != c->qkv_bias || ob != c->o_bias || mb != c->mlp_bias) {
        return og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: layer %d has biases layer 0 has not (or the reverse): not "
                            "supported", s->path, i);
    }
    if (c->qkv_bias &&
        ((rc = map_tensor(s, G("attn_k.bias"), HF("self_attn.k_proj.bias"), 1, Hkv * D, 0, llama ? (int32_t)Hkv : 0,
                          false, NULL)) ||
         (rc = map_tensor(s, G("attn_v.bias"), HF("self_attn.v_proj.bias"), 1, Hkv * D, 0, 0, false, NULL))))
        return rc;
    if (c->mlp_bias &&
        ((rc = map_tensor(s, G("ffn_up.bias"), HF("mlp.up_proj.bias"), 1, F, 0, 0, false, NULL)) ||
         (rc = map_tensor(s, G("ffn_down.bias"), HF("mlp.down_proj.bias"), 1, H, 0, 0, false, NULL))))
        return rc;
    if (c->qk_norm &&
        (rc = map_tensor(s, G("attn_k_norm.weight"), HF("self_attn.k_norm.weight"), 1, D, 0, 0, false, NULL)))
        return rc;
    return OG_OK;
}
#undef G
#undef HF

/* Every tensor of the file to its Hugging Face name: the embedding, the
 * final norm, the head (absent: tied), each layer; a tensor left over is an
 * error. */
static og_status map_all(gsrc *s, og_hf_config *c) {
    const int64_t H = c->hidden_size;
    const og_gguf_tensor *embd = og_gguf_find_tensor(s->g, "token_embd.weight");
    if (!embd) return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"token_embd.weight\" is missing", s->path);
    if (embd->ne[1] < 1 || embd->ne[1] > OG_MAX_VOCAB)
        return og_set_error(OG_ERR_FORMAT, "gguf %s: tensor \"token_embd.weight\": %lld rows is not a vocabulary size "
                            "this build supports", s->path, (long long)embd->ne[1]);
    c->vocab_size = embd->ne[1];
    og_status rc;
    bool has_output;
    if ((rc = map_tensor(s, "token_embd.weight", "model.embed_tokens.weight", 2, c->vocab_size, H, 0, false, NULL)) ||
        (rc = map_tensor(s, "output_norm.weight", "model.norm.weight", 1, H, 0, 0, false, NULL)))
        return rc;
    if (c->norm_plus_one) set_xform(s, GX_MINUS_ONE);
    if ((rc = map_tensor(s, "output.weight", "lm_head.weight", 2, c->vocab_size, H, 0, true, &has_output))) return rc;
    c->tie_word_embeddings = !has_output;
    for (int32_t i = 0; i < c->num_hidden_layers; i++)
        if ((rc = og_hf_is_hybrid(c->family) ? map_hybrid_layer(s, c, i) : map_dense_layer(s, c, i))) return rc;
    /* every tensor of the file must have been used: an unknown one means a
     * model this mapping does not describe */
    const int64_t nt = og_gguf_n_tensors(s->g);
    uint8_t *used = og_calloc((size_t)nt, 1);
    if (!used) return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    for (int32_t k = 0; k < s->n; k++) used[s->maps[k].g - og_gguf_tensor_at(s->g, 0)] = 1;
    for (int64_t i = 0; i < nt && rc == OG_OK; i++) {
        const og_gguf_tensor *t = og_gguf_tensor_at(s->g, i);
        if (!used[i] && strcmp(t->name, "rope_freqs.weight"))
            rc = og_set_error(OG_ERR_UNSUPPORTED, "gguf %s: tensor \"%s\" is not part of a %s model this exporter "
                              "knows: not supported", s->path, t->name, og_hf_family_name(c->family));
    }
    og_free(used);
    if (rc != OG_OK) return rc;
    qsort(s->maps, (size_t)s->n, sizeof *s->maps, cmp_gmap);
    return OG_OK;
}

og_status og_export_gguf(const char *gguf_path, const char *out_path, const og_export_options *opts,
                         og_export_summary *summary) {
    if (!gguf_path || !out_path) return og_set_error(OG_ERR_INVALID_ARGUMENT, "export: NULL path");
    og_hf_config *cfg = og_malloc(sizeof *cfg);
    if (!cfg) return og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    gsrc s = {.path = gguf_path};
    char arch[64], *tok = NULL, *tok_cfg = NULL;
    og_status rc = og_gguf_open_file(gguf_path, &s.g);
    if (rc == OG_OK) rc = read_hparams(s.g, cfg, arch, sizeof arch);
    if (rc == OG_OK) {
        /* 3 + per layer: 2 norms, 7 matrices, 7 biases, 2 q/k norms, and
         * a router, 3 tensors per expert and 4 of a shared expert in a
         * sparse layer (a linear layer's 10 tensors fit within these) */
        s.cap = 3 + cfg->num_hidden_layers * (18 + 1 + 4 + 3 * cfg->num_experts);
        s.maps = og_calloc((size_t)s.cap, sizeof *s.maps);
        if (!s.maps) rc = og_set_error(OG_ERR_OUT_OF_MEMORY, "export: out of memory");
    }
    if (rc == OG_OK) rc = map_all(&s, cfg);
    if (rc == OG_OK) rc = og_gguf_tokenizer(s.g, &tok, &tok_cfg);
    if (rc == OG_OK && tok) { /* the rebuilt tokenizer must load, or the export fails here, not at run */
        og_tokenizer *t = NULL;
        rc = og_tokenizer_load_json(tok, &t);
        if (rc == OG_OK) rc = og_tokenizer_load_config(t, tok_cfg);
        if (rc != OG_OK) {
            char msg[OG_ERRMSG_CAP];
            snprintf(msg, sizeof msg, "%s", og_last_error());
            rc = og_set_error(rc, "gguf %s: the tokenizer rebuilt from its metadata does not load: %s", gguf_path, msg);
        }
        og_tokenizer_destroy(t);
    }
    const og_gguf_kv *tokens = og_gguf_find_kv(s.g, "tokenizer.ggml.tokens");
    if (rc == OG_OK && tok && tokens->count > (uint64_t)cfg->vocab_size)
        rc = og_set_error(OG_ERR_FORMAT, "gguf %s: key \"tokenizer.ggml.tokens\" has %llu tokens, more than the %lld rows "
                          "of token_embd.weight", gguf_path, (unsigned long long)tokens->count,
                          (long long)cfg->vocab_size);
    char *tok_model = NULL;
    if (rc == OG_OK && !tok) og_gguf_get_str(s.g, "tokenizer.ggml.model", false, &tok_model, NULL);
    if (rc == OG_OK) {
        og_export_source src = {.find = gsrc_find,
                                .fill = gsrc_fill,
                                .ctx = &s,
                                .origin = gguf_path,
                                .config_name = "the GGUF metadata",
                                .tokenizer_json = tok,
                                .tokenizer_config = tok_cfg,
                                .no_tokenizer = tok_model && !strcmp(tok_model, "no_vocab")
                                                    ? "exported from a GGUF file whose tokenizer.ggml.model is "
                                                      "\"no_vocab\""
                                                    : NULL};
        og_export_options o;
        if (opts) o = *opts;
        else og_export_default_options(&o);
        /* quantized matrices and no weights asked: each matrix as stored
         * (a llama-quantize file mixes types), named by attn_q's */
        const og_st_tensor *q = gsrc_find(&s, "model.layers.0.self_attn.q_proj.weight");
        if (!q) q = gsrc_find(&s, "model.layers.0.linear_attn.in_proj_qkv.weight");
        if (o.weights == OG_DTYPE_COUNT && o.mix == OG_MIX_NONE && q && og_dtype_is_quantized(q->dtype)) {
            o.weights = q->dtype;
            o.mix = OG_MIX_AS_STORED;
        }
        rc = og_export_program(cfg, &src, out_path, &o, summary);
    }
    og_free(tok);
    og_free(tok_cfg);
    og_free(tok_model);
    og_free(s.maps);
    og_gguf_close(s.g);
    og_free(cfg);
    return rc;
}
