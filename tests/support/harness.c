#include "harness.h"

#include <stdlib.h>
#include <string.h>

int og_test_passed, og_test_failed;

void og_test_section(const char *name) { fprintf(stderr, "-- %s\n", name); }

int og_test_finish(void) {
    printf("%d passed, %d failed\n", og_test_passed, og_test_failed);
    return og_test_failed ? 1 : 0;
}

og_rng og_rng_seed(uint64_t seed) {
    og_rng r = {seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull};
    if (!r.s) r.s = 1;
    return r;
}

uint64_t og_rng_next(og_rng *r) {
    uint64_t x = r->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float og_rng_uniform(og_rng *r, float lo, float hi) {
    double u = (double)(og_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

void og_rng_fill(og_rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = og_rng_uniform(r, lo, hi);
}

static double ratio_one(double a, double b, double atol, double rtol) {
    if (isnan(a) || isnan(b)) return INFINITY;
    return fabs(a - b) / (atol + rtol * fabs(b));
}

double og_tol_ratio(const float *a, const float *b, size_t n, double atol, double rtol,
                    size_t *worst) {
    double m = 0;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ratio_one(a[i], b[i], atol, rtol);
        if (r > m || (i == 0 && r >= m)) { m = r; w = i; }
    }
    if (worst) *worst = w;
    return m;
}

double og_tol_ratio_d(const float *a, const double *b, size_t n, double atol, double rtol,
                      size_t *worst) {
    double m = 0;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ratio_one(a[i], b[i], atol, rtol);
        if (r > m) { m = r; w = i; }
    }
    if (worst) *worst = w;
    return m;
}

void og_poison(float *x, size_t n) {
    uint32_t nan = 0x7fc0dead;
    for (size_t i = 0; i < n; i++) memcpy(&x[i], &nan, sizeof nan);
}

char *og_test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    if (p) p[n] = 0;
    fclose(f);
    return p;
}
