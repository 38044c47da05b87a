/* AVX-512 and AVX2 versions of the k-quant products (kquant_cpu.h). */
#include "kernels/kquant_cpu.h"

bool og_kq_gemv_avx512(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                       bool stream, float *out, int64_t ldo) {
    return false;
}
bool og_kq_gemv_avx2(og_dtype dt, const og_kq_x *x, int64_t R, const uint8_t *w, int64_t K, int64_t rows,
                     bool stream, float *out, int64_t ldo) {
    return false;
}
bool og_kq_dequantize_avx512(og_dtype dt, const uint8_t *w, int64_t K, int64_t rows, float *dst) { return false; }
