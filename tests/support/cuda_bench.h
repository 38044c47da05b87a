/* For the GPU benchmarks: the median's comparison and the device's copy
 * rate, the ceiling every bandwidth figure is quoted against. */
#ifndef OG_TEST_CUDA_BENCH_H
#define OG_TEST_CUDA_BENCH_H

#include "cuda_check.h"

/* qsort order of floats (timings in ms). */
static inline int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Device-to-device copy rate in bytes (read + written) per second: the
 * median of 20 copies of 1 GiB after 2 untimed ones. */
static inline double copy_rate(cudaStream_t st) {
    const size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[20];
    for (int r = -2; r < 20; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (r >= 0) CK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    qsort(ms, 20, sizeof *ms, cmp_float);
    cudaFree(a), cudaFree(b);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 2.0 * (double)n / ((double)ms[10] * 1e-3);
}

#endif
