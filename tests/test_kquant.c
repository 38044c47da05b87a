/* The k-quant weight formats (q2_k .. q6_k), the reference code in core,
 * against llama.cpp's own tools (tests/data/kquant, written by
 * tests/fixtures/make_kquant_fixtures.py):
 *  - og_tensor_bytes sizes and refusals;
 *  - og_dequantize_row on random super-blocks gives, bit for bit, the f32
 *    values the gguf Python package's dequantization gave them;
 *  - og_quantize_rows on edge-case rows (zeros, constants, one sign, tiny
 *    and huge values, ties, spikes) writes, byte for byte, what
 *    ggml_quantize_chunk (the function llama-quantize calls) wrote;
 *  - non-finite input refused naming the row; the round trip bounded.
 * Letters: N rows, K elements per row (a multiple of 256). */
#include "core/core.h"
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { QK = OG_KQUANT_BLOCK, BLOCKS = 24, QROWS = 16, QCOLS = 512 };

static const struct {
    og_dtype dt;
    const char *gguf; /* the ggml type name in the fixture file names */
    size_t bytes;
} k_types[] = {{OG_DTYPE_Q2_K, "q2_K", 84},  {OG_DTYPE_Q3_K, "q3_K", 110}, {OG_DTYPE_Q4_K, "q4_K", 144},
               {OG_DTYPE_Q5_K, "q5_K", 176}, {OG_DTYPE_Q6_K, "q6_K", 210}};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

/* The whole file at OG_TEST_DATA_DIR/kquant/name; *size its bytes. */
static uint8_t *read_fixture(const char *name, size_t *size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/kquant/%s", OG_TEST_DATA_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static void test_sizes(void) {
    og_test_section("og_tensor_bytes of the k-quants");
    for (size_t t = 0; t < N_TYPES; t++) {
        const og_dtype dt = k_types[t].dt;
        int64_t b = -1;
        const int64_t s[2] = {3, 512}, one[2] = {1, 256}, k128[2] = {2, 128}, k288[2] = {2, 288},
                      r1[1] = {256}, r3[3] = {1, 2, 256}, huge[2] = {INT64_MAX / 256, 512};
        CHECK(og_dtype_is_quantized(dt) && og_dtype_is_kquant(dt) && og_dtype_size(dt) == 0);
        CHECK(og_kquant_block_bytes(dt) == k_types[t].bytes);
        CHECK(og_tensor_bytes(dt, 2, s, &b) && b == 3 * 2 * (int64_t)k_types[t].bytes);
        CHECK(og_tensor_bytes(dt, 2, one, &b) && b == (int64_t)k_types[t].bytes);
        b = -7;
        CHECK(!og_tensor_bytes(dt, 2, k128, &b)); /* rows not whole super-blocks */
        CHECK(!og_tensor_bytes(dt, 2, k288, &b));
        CHECK(!og_tensor_bytes(dt, 1, r1, &b));   /* a k-quant tensor is [N, K] */
        CHECK(!og_tensor_bytes(dt, 3, r3, &b));
        CHECK(!og_tensor_bytes(dt, 2, huge, &b)); /* N * K overflows */
        CHECK(b == -7);
        og_dtype back = OG_DTYPE_COUNT;
        CHECK_OK(og_dtype_parse(og_dtype_name(dt), &back));
        CHECK(back == dt);
    }
    CHECK(!og_dtype_is_kquant(OG_DTYPE_Q8) && !og_dtype_is_kquant(OG_DTYPE_Q4) && !og_dtype_is_kquant(OG_DTYPE_BF16));
    CHECK(!strcmp(og_dtype_name(OG_DTYPE_Q4_K), "q4_k") && !strcmp(og_dtype_name(OG_DTYPE_Q6_K), "q6_k"));
}

/* Random blocks against the gguf package's values, every bit (a NaN would
 * compare by its bits too; the fixture's scales are finite). */
static void test_dequantize(void) {
    og_test_section("dequantization = the gguf package's, bit for bit");
    for (size_t t = 0; t < N_TYPES; t++) {
        char name[64];
        snprintf(name, sizeof name, "dequant-%s.bin", k_types[t].gguf);
        size_t size = 0;
        uint8_t *buf = read_fixture(name, &size);
        const size_t bb = k_types[t].bytes, want = BLOCKS * bb + BLOCKS * QK * 4;
        CHECK_MSG(buf && size == want, "%s: %zu bytes, want %zu", name, size, want);
        if (!buf || size != want) {
            free(buf);
            continue;
        }
        const float *ref = (const float *)(buf + BLOCKS * bb);
        /* as one row of all the blocks, and as rows of one block each */
        float *out = malloc(BLOCKS * QK * sizeof(float));
        og_poison(out, BLOCKS * QK);
        og_dequantize_row(k_types[t].dt, buf, 1, BLOCKS * QK, 0, out);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < BLOCKS * QK; i++)
            if (memcmp(&out[i], &ref[i], 4) && !bad++) first = i;
        CHECK_MSG(bad == 0, "%s: %zu of %d values differ, first at %zu (block %zu): %.9g, want %.9g", name, bad,
                  BLOCKS * QK, first, first / QK, (double)out[first], (double)ref[first]);
        og_poison(out, BLOCKS * QK);
        for (int r = 0; r < BLOCKS; r++) og_dequantize_row(k_types[t].dt, buf, BLOCKS, QK, r, out + r * QK);
        CHECK(memcmp(out, ref, BLOCKS * QK * 4) == 0);
        /* the fixture is not trivial: most values are nonzero and distinct */
        size_t nonzero = 0;
        for (size_t i = 0; i < BLOCKS * QK; i++) nonzero += ref[i] != 0;
        CHECK_MSG(nonzero > BLOCKS * QK / 2, "%s: only %zu nonzero values", name, nonzero);
        free(out);
        free(buf);
    }
}

static void test_quantize(void) {
    og_test_section("quantization = llama.cpp's, byte for byte");
    size_t size = 0;
    uint8_t *in = read_fixture("quant-input.f32", &size);
    CHECK_MSG(in && size == QROWS * QCOLS * 4, "quant-input.f32: %zu bytes", size);
    if (!in || size != QROWS * QCOLS * 4) {
        free(in);
        return;
    }
    const float *x = (const float *)in;
    for (size_t t = 0; t < N_TYPES; t++) {
        const og_dtype dt = k_types[t].dt;
        char name[64];
        snprintf(name, sizeof name, "quant-%s.bin", k_types[t].gguf);
        size_t qsize = 0;
        uint8_t *want = read_fixture(name, &qsize);
        const size_t rb = QCOLS / QK * k_types[t].bytes;
        CHECK_MSG(want && qsize == QROWS * rb, "%s: %zu bytes", name, qsize);
        if (!want || qsize != QROWS * rb) {
            free(want);
            continue;
        }
        uint8_t *got = malloc(QROWS * rb);
        memset(got, 0xA5, QROWS * rb);
        CHECK_OK(og_quantize_rows(dt, x, QROWS, QCOLS, got));
        for (int r = 0; r < QROWS; r++) {
            for (int blk = 0; blk < QCOLS / QK; blk++) {
                const size_t off = (size_t)r * rb + (size_t)blk * k_types[t].bytes;
                size_t at = 0;
                while (at < k_types[t].bytes && got[off + at] == want[off + at]) at++;
                CHECK_MSG(at == k_types[t].bytes, "%s: row %d block %d differs from byte %zu: 0x%02x, want 0x%02x",
                          og_dtype_name(dt), r, blk, at, got[off + at], want[off + at]);
            }
        }
        /* the round trip: every element within a generous bound of its
         * input (the levels span the block: at most a level step away,
         * here bounded by the row's range over the levels, plus f16
         * rounding of the scales) */
        float *back = malloc(QCOLS * sizeof(float));
        const int levels[] = {[OG_DTYPE_Q2_K] = 3, [OG_DTYPE_Q3_K] = 7, [OG_DTYPE_Q4_K] = 15,
                              [OG_DTYPE_Q5_K] = 31, [OG_DTYPE_Q6_K] = 63};
        for (int r = 0; r < QROWS; r++) {
            og_dequantize_row(dt, got, QROWS, QCOLS, r, back);
            float lo = 0, hi = 0, worst = 0;
            for (int k = 0; k < QCOLS; k++) {
                const float v = x[r * QCOLS + k];
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                const float e = fabsf(back[k] - v);
                worst = e > worst ? e : worst;
            }
            const float bound = 2.5f * (hi - lo) / (float)levels[dt] + 1e-6f;
            CHECK_MSG(worst <= bound, "%s row %d: round trip off by %g (range %g, bound %g)", og_dtype_name(dt), r,
                      (double)worst, (double)(hi - lo), (double)bound);
        }
        free(back);
        free(got);
        free(want);
    }
    free(in);

    /* a non-finite element is refused, naming its row */
    float bad[2 * QK];
    for (int i = 0; i < 2 * QK; i++) bad[i] = 0.01f * (float)(i % 7);
    bad[QK + 5] = NAN;
    uint8_t q[2 * 210];
    CHECK_STATUS(og_quantize_rows(OG_DTYPE_Q4_K, bad, 2, QK, q), OG_ERR_INVALID_ARGUMENT);
    CHECK(strstr(og_last_error(), "row 1") != NULL);
    bad[QK + 5] = INFINITY;
    CHECK_STATUS(og_quantize_rows(OG_DTYPE_Q6_K, bad, 2, QK, q), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_quantize_rows(OG_DTYPE_Q5_K, bad, 1, 128, q), OG_ERR_INVALID_ARGUMENT); /* K not 256s */
}

int main(void) {
    test_sizes();
    test_dequantize();
    test_quantize();
    return og_test_finish();
}
