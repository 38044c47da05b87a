/* compare_logits: compares a logits file against a reference one, both
 * float32 little-endian [rows, vocab].
 *
 *   compare_logits <got.f32> <ref.f32> <rows> <atol>
 *
 * Passes (exit 0) when every |got - ref| <= atol and, at every row whose two
 * best reference logits differ by more than atol, the arg-max tokens agree
 * (where the gap is smaller, the error bound allows either order). Prints the
 * largest error, its place, and the number of rows whose arg-max was checked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static float *load(const char *path, long *count) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "compare_logits: cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *x = malloc((size_t)bytes + 1);
    if (!x || fread(x, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "compare_logits: cannot read %s\n", path);
        free(x);
        x = NULL;
    }
    fclose(f);
    *count = bytes / (long)sizeof(float);
    return x;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: compare_logits <got.f32> <ref.f32> <rows> <atol>\n");
        return 2;
    }
    long n_got, n_ref, rows = atol(argv[3]);
    double tol = atof(argv[4]);
    float *got = load(argv[1], &n_got), *ref = load(argv[2], &n_ref);
    if (!got || !ref || rows <= 0 || n_got != n_ref || n_ref % rows) {
        fprintf(stderr, "compare_logits: sizes differ or do not divide into %ld rows (%ld vs %ld floats)\n", rows,
                n_got, n_ref);
        return 1;
    }
    long V = n_ref / rows, worst = 0, checked = 0, mismatched = 0;
    double max_err = 0;
    for (long r = 0; r < rows; r++) {
        long best_g = 0, best_r = 0, second_r = -1;
        for (long j = 0; j < V; j++) {
            double e = fabs((double)got[r * V + j] - (double)ref[r * V + j]);
            if (!(e <= max_err)) { /* also catches NaN */
                max_err = isnan(e) ? INFINITY : e;
                worst = r * V + j;
            }
            if (got[r * V + j] > got[r * V + best_g]) best_g = j;
            if (ref[r * V + j] > ref[r * V + best_r]) {
                second_r = best_r;
                best_r = j;
            } else if (j != best_r && (second_r < 0 || ref[r * V + j] > ref[r * V + second_r])) {
                second_r = j;
            }
        }
        double gap = second_r >= 0 ? ref[r * V + best_r] - ref[r * V + second_r] : INFINITY;
        if (gap > tol) {
            checked++;
            if (best_g != best_r) mismatched++;
        }
    }
    int ok = max_err <= tol && mismatched == 0;
    printf("%s: max |error| %.3g at row %ld token %ld (bound %.3g); arg-max agrees on %ld/%ld rows checked\n",
           ok ? "ok" : "FAIL", max_err, worst / V, worst % V, tol, checked - mismatched, checked);
    free(got);
    free(ref);
    return ok ? 0 : 1;
}
