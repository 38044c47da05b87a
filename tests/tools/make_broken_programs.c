/* Regenerates the committed program test data from the fixture:
 *   tests/data/program/valid.ogp          the synthetic 2-layer program
 *   tests/data/program/broken/<rule>.ogp  one file per validation rule
 *   tests/fuzz/corpus/program/            the same files, as fuzz seeds
 * Usage: make_broken_programs <source dir>. test_program_broken checks that
 * the committed files equal what this writes. */
#include "program_fixture.h"

#include <stdio.h>
#include <stdlib.h>

static int write_file(const char *dir, const char *name, const uint8_t *b, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "make_broken_programs: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_broken_programs <source dir>\n");
        return 2;
    }
    char data[900], broken[1000], corpus[1000], valid_path[1000];
    snprintf(data, sizeof data, "%s/tests/data/program", argv[1]);
    snprintf(broken, sizeof broken, "%s/broken", data);
    snprintf(corpus, sizeof corpus, "%s/tests/fuzz/corpus/program", argv[1]);
    snprintf(valid_path, sizeof valid_path, "%s/valid.ogp", data);
    if (og_fixture_write_program(valid_path, NULL) != OG_OK) {
        fprintf(stderr, "make_broken_programs: %s\n", og_last_error());
        return 1;
    }
    size_t vn;
    uint8_t *valid = og_fixture_read_file(valid_path, &vn);
    if (!valid) return 1;
    int fails = write_file(corpus, "valid.ogp", valid, vn), n;
    const og_broken_case *cases = og_broken_cases(&n);
    for (int i = 0; i < n; i++) {
        uint8_t *b;
        size_t bn;
        if (og_broken_build(i, valid, vn, &b, &bn) != OG_OK) {
            fprintf(stderr, "make_broken_programs: %s: %s\n", cases[i].file, og_last_error());
            fails++;
            continue;
        }
        fails += write_file(broken, cases[i].file, b, bn);
        fails += write_file(corpus, cases[i].file, b, bn);
        free(b);
    }
    free(valid);
    printf("wrote valid.ogp and %d broken programs\n", n);
    return fails ? 1 : 0;
}
