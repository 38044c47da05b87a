/* Replays every fuzz corpus (each file of tests/fuzz/corpus/<name>/) through its
 * harness og_fuzz_<name> in a normal build: seeds and past crashers must
 * run clean (the sanitizer build turns a bad access into a failure). */
#include "harness.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

typedef int (*fuzz_fn)(const uint8_t *, size_t);

#define OG_FUZZ_HARNESS(name) int og_fuzz_##name(const uint8_t *data, size_t size);
#include "fuzz_harnesses.h"
#undef OG_FUZZ_HARNESS

static const struct {
    const char *name;
    fuzz_fn fn;
} k_harnesses[] = {
#define OG_FUZZ_HARNESS(name) {#name, og_fuzz_##name},
#include "fuzz_harnesses.h"
#undef OG_FUZZ_HARNESS
    {NULL, NULL},
};

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    uint8_t *b = malloc(cap);
    size_t got;
    while (b && (got = fread(b + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    fclose(f);
    *n = len;
    return b;
}

int main(void) {
    for (int h = 0; k_harnesses[h].name; h++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", OG_SOURCE_DIR, k_harnesses[h].name);
        og_test_section(dir);
        DIR *d = opendir(dir);
        CHECK_MSG(d != NULL, "harness %s has no corpus folder", k_harnesses[h].name);
        int files = 0;
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            size_t n = 0;
            uint8_t *b = read_all(path, &n);
            CHECK_MSG(b != NULL, "cannot read %s", path);
            if (b) CHECK_MSG(k_harnesses[h].fn(b, n) == 0, "%s", path);
            free(b);
            files++;
        }
        if (d) closedir(d);
        CHECK_MSG(files > 0, "corpus %s is empty", dir);
        printf("%s: %d inputs\n", k_harnesses[h].name, files);
    }
    return og_test_finish();
}
