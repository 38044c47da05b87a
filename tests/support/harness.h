/* A minimal test harness: CHECK macros that count failures and keep going,
 * a deterministic random source, and helpers shared by the tests.
 * A test's main() ends with `return og_test_finish();`, which prints
 * "N passed, M failed" and returns non-zero on any failure. */
#ifndef OG_TEST_HARNESS_H
#define OG_TEST_HARNESS_H

#include "offgraph.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

extern int og_test_passed, og_test_failed;

#define OG_TEST_SKIP 77

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (cond) {                                                                        \
            og_test_passed++;                                                              \
        } else {                                                                           \
            og_test_failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);      \
        }                                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                                               \
    do {                                                                                   \
        if (cond) {                                                                        \
            og_test_passed++;                                                              \
        } else {                                                                           \
            og_test_failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);      \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* Checks a status, printing both names and og_last_error() on mismatch. */
#define CHECK_STATUS(expr, want)                                                           \
    do {                                                                                   \
        og_status got_ = (expr);                                                           \
        CHECK_MSG(got_ == (want), "%s returned %s, want %s (%s)", #expr,                   \
                  og_status_str(got_), og_status_str(want), og_last_error());              \
    } while (0)
#define CHECK_OK(expr) CHECK_STATUS(expr, OG_OK)

/* Section header, printed so a failure can be found in the log. */
void og_test_section(const char *name);
/* Prints the summary line; returns 0 when nothing failed, 1 otherwise. */
int og_test_finish(void);

/* Deterministic xorshift random source. */
typedef struct og_rng {
    uint64_t s;
} og_rng;
og_rng og_rng_seed(uint64_t seed);
uint64_t og_rng_next(og_rng *r);
/* Uniform in [lo, hi). */
float og_rng_uniform(og_rng *r, float lo, float hi);
void og_rng_fill(og_rng *r, float *x, size_t n, float lo, float hi);

/* Largest |a - b| / (atol + rtol * |b|) over n elements (<= 1 means within
 * tolerance); *worst gets the index of the worst element if non-NULL.
 * A NaN anywhere counts as infinitely bad. */
double og_tol_ratio(const float *a, const float *b, size_t n, double atol, double rtol,
                    size_t *worst);
/* Same, against a double-precision reference. */
double og_tol_ratio_d(const float *a, const double *b, size_t n, double atol, double rtol,
                      size_t *worst);

/* Reads a whole file, NUL-terminated; NULL when it cannot. Owned by the
 * caller: free. */
char *og_test_read_file(const char *path);

/* Fills n floats with a NaN pattern, so that an output never written shows. */
void og_poison(float *x, size_t n);

#endif
