/* A loaded program maps its file and copies nothing, so the file must not
 * change while loaded (og_model_load's contract). What offgraph writes
 * keeps to that: an export onto the path of a loaded program writes a temp
 * file and renames it over the path, never rewriting the old file in place.
 * Checked here: a model and a mapping of the old file are held while the
 * same path is exported again with other bytes; the old mapping still
 * reads the old bytes, the model still gives the same logits, the path now
 * names another file with the new bytes; an export that fails leaves the
 * path as it was. */
#include "harness.h"
#include "import/export.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *k_dir = OG_TEST_DATA_DIR "/hf-synthetic/llama-v4-sharded";

static void logits_of(og_model *m, float *out) {
    og_session *s = NULL;
    const int32_t tokens[4] = {1, 5, 9, 3};
    CHECK_OK(og_session_create(m, NULL, &s));
    if (s) CHECK_OK(og_session_eval(s, tokens, 4, 0, out, 0));
    og_session_destroy(s);
}

int main(void) {
    char path[] = "/tmp/og_test_mapping_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);
    og_export_options o;
    og_export_default_options(&o);
    o.dtype = OG_DTYPE_F32;
    CHECK_OK(og_export_hf(k_dir, path, &o, NULL));

    og_test_section("re-export onto a loaded program's path");
    og_model_params mp = og_model_default_params();
    mp.backend = OG_BACKEND_CPU;
    mp.n_threads = 1;
    og_model *m = NULL;
    CHECK_OK(og_model_load(path, &mp, &m));
    struct stat before, after;
    CHECK(stat(path, &before) == 0);
    const size_t size = (size_t)before.st_size;
    fd = open(path, O_RDONLY);
    void *map = fd >= 0 ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd);
    CHECK(map != MAP_FAILED);
    uint8_t *old = malloc(size);
    if (map != MAP_FAILED && old) memcpy(old, map, size);
    const int64_t V = m ? og_model_vocab_size(m) : 0;
    float *a = calloc((size_t)V + 1, sizeof *a), *b = calloc((size_t)V + 1, sizeof *b);
    if (m) logits_of(m, a);

    o.dtype = OG_DTYPE_BF16; /* other bytes at the same path */
    CHECK_OK(og_export_hf(k_dir, path, &o, NULL));
    CHECK(stat(path, &after) == 0);
    CHECK_MSG(after.st_ino != before.st_ino, "the export rewrote the loaded file in place (same inode)");
    CHECK_MSG(map != MAP_FAILED && old && !memcmp(map, old, size),
              "the old mapping no longer reads the old bytes");
    CHECK_MSG((size_t)after.st_size != size, "the second export wrote the same size (the test needs other bytes)");
    if (m) {
        logits_of(m, b);
        CHECK_MSG(!memcmp(a, b, (size_t)V * sizeof *a), "the loaded model's logits changed");
    }
    og_model *fresh = NULL;
    CHECK_OK(og_model_load(path, &mp, &fresh));
    og_model_destroy(fresh);

    og_test_section("a failed export leaves the path as it was");
    CHECK(stat(path, &before) == 0);
    CHECK(og_export_hf(OG_TEST_DATA_DIR "/hf-synthetic/bad-model-type", path, &o, NULL) != OG_OK);
    CHECK(og_export_hf(OG_TEST_DATA_DIR "/hf-synthetic/huge-vocab", path, &o, NULL) != OG_OK);
    CHECK(stat(path, &after) == 0 && after.st_ino == before.st_ino && after.st_size == before.st_size);

    if (map != MAP_FAILED) munmap(map, size);
    free(old);
    free(a);
    free(b);
    og_model_destroy(m);
    unlink(path);
    return og_test_finish();
}
