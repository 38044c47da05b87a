/* For the GPU tests and benchmarks (never the library, which returns
 * statuses): CK(call) checks a CUDA runtime call and ends the program with
 * the file, line, call and CUDA's message when it fails. */
#ifndef OG_TEST_CUDA_CHECK_H
#define OG_TEST_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

#endif
