/* safetensors reader: valid files (single, sharded, in memory) parse to the
 * shapes and bytes they were written with; every malformed header is
 * refused with a message naming the tensor and the rule. */
#include "harness.h"
#include "import/safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An image: 8-byte little-endian length, the header, then data_len bytes
 * counting 0, 1, 2, ... Owned by the caller: free. */
static uint8_t *image(const char *header, size_t data_len, size_t *size) {
    size_t n = strlen(header);
    *size = 8 + n + data_len;
    uint8_t *b = malloc(*size);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(b + 8, header, n);
    for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (uint8_t)i;
    return b;
}

/* Expects header (with data_len data bytes) to be refused with status st
 * and a message containing every one of the needles. */
static void refused(const char *what, const char *header, size_t data_len, og_status st, const char *needle1,
                    const char *needle2) {
    size_t size;
    uint8_t *b = image(header, data_len, &size);
    og_safetensors *s = (og_safetensors *)(uintptr_t)1;
    og_status got = og_safetensors_open_memory(b, size, "case.safetensors", &s);
    const char *msg = og_last_error();
    CHECK_MSG(got == st, "%s: got %s, want %s (%s)", what, og_status_str(got), og_status_str(st), msg);
    CHECK_MSG(s == NULL, "%s: handle not cleared", what);
    CHECK_MSG(strstr(msg, "case.safetensors") != NULL, "%s: message does not name the file: %s", what, msg);
    CHECK_MSG(strstr(msg, needle1) != NULL, "%s: message lacks \"%s\": %s", what, needle1, msg);
    if (needle2) CHECK_MSG(strstr(msg, needle2) != NULL, "%s: message lacks \"%s\": %s", what, needle2, msg);
    free(b);
}

static void test_valid_memory(void) {
    og_test_section("valid image");
    /* data: a = F32 [2,3] at 0..24, b = BF16 [4] at 24..32, c = F16 [] at 32..34 */
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"c\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[32,34]}}";
    size_t size;
    uint8_t *b = image(h, 34, &size);
    og_safetensors *s = NULL;
    CHECK_OK(og_safetensors_open_memory(b, size, "valid", &s));
    CHECK(og_safetensors_count(s) == 3);
    const og_st_tensor *a = og_safetensors_find(s, "a"), *tb = og_safetensors_find(s, "b"),
                       *c = og_safetensors_find(s, "c");
    CHECK(a && tb && c && !og_safetensors_find(s, "__metadata__") && !og_safetensors_find(s, "d"));
    if (a && tb && c) {
        size_t base = size - 34;
        CHECK(a->dtype == OG_DTYPE_F32 && a->rank == 2 && a->shape[0] == 2 && a->shape[1] == 3);
        CHECK(a->numel == 6 && a->nbytes == 24 && a->data == b + base);
        CHECK(tb->dtype == OG_DTYPE_BF16 && tb->rank == 1 && tb->numel == 4 && tb->data == b + base + 24);
        CHECK(c->dtype == OG_DTYPE_F16 && c->rank == 0 && c->numel == 1 && c->nbytes == 2);
        CHECK(((const uint8_t *)c->data)[0] == 32 && ((const uint8_t *)c->data)[1] == 33);
    }
    /* sorted by name */
    CHECK(og_safetensors_at(s, 0) == a && og_safetensors_at(s, 2) == c && !og_safetensors_at(s, 3));
    og_safetensors_close(s);
    free(b);

    /* an empty header is a valid file with no tensors */
    b = image("{}", 0, &size);
    CHECK_OK(og_safetensors_open_memory(b, size, "empty", &s));
    CHECK(og_safetensors_count(s) == 0 && og_safetensors_find(s, "a") == NULL);
    og_safetensors_close(s);
    free(b);
}

static void test_refusals(void) {
    og_test_section("malformed headers");
    uint8_t tiny[5] = {0};
    og_safetensors *s = NULL;
    CHECK_STATUS(og_safetensors_open_memory(tiny, sizeof tiny, "case.safetensors", &s), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "shorter than the 8-byte") != NULL);
    uint8_t huge[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK_STATUS(og_safetensors_open_memory(huge, sizeof huge, "case.safetensors", &s), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "header length 65535 is out of range") != NULL);

    refused("not an object", "[1,2]", 0, OG_ERR_FORMAT, "does not start with '{'", NULL);
    refused("bad json", "{\"a\":", 0, OG_ERR_FORMAT, "not valid JSON", NULL);
    refused("entry", "{\"w\":3}", 0, OG_ERR_FORMAT, "\"w\"", "not an object");
    refused("metadata", "{\"__metadata__\":[1]}", 0, OG_ERR_FORMAT, "__metadata__", "not an object");
    refused("dtype missing", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, OG_ERR_FORMAT, "\"w\"",
            "\"dtype\" missing");
    refused("dtype I8", "{\"w\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, OG_ERR_UNSUPPORTED,
            "\"w\"", "dtype \"I8\" is not supported");
    refused("dtype F64", "{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
            OG_ERR_UNSUPPORTED, "\"w\"", "\"F64\"");
    refused("shape missing", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, OG_ERR_FORMAT, "\"w\"",
            "\"shape\" missing");
    refused("shape negative", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]}}", 4,
            OG_ERR_FORMAT, "\"w\"", "shape[1] is not a non-negative integer");
    refused("shape fraction", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
            OG_ERR_FORMAT, "\"w\"", "shape[0]");
    refused("rank", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
            OG_ERR_FORMAT, "\"w\"", "rank 9 exceeds 8");
    refused("overflow",
            "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
            OG_ERR_FORMAT, "\"w\"", "overflows");
    refused("offsets shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
            OG_ERR_FORMAT, "\"w\"", "\"data_offsets\" is not [begin, end]");
    refused("offsets reversed", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4,
            OG_ERR_FORMAT, "\"w\"", "begin 4 > end 0");
    refused("out of bounds", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
            OG_ERR_FORMAT, "\"w\"", "end 8 past the data (4 bytes)");
    refused("size mismatch", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
            OG_ERR_FORMAT, "\"w\"", "span 8 bytes, shape x dtype needs 6");
    refused("overlap",
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
            12, OG_ERR_FORMAT, "\"x\" and \"y\" overlap", NULL);
    refused("duplicate",
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
            8, OG_ERR_FORMAT, "\"x\" appears twice", NULL);
}

static void test_files(void) {
    og_test_section("files and shards");
    og_safetensors *s = NULL;
    CHECK_OK(og_safetensors_open_file(OG_SOURCE_DIR "/tests/fuzz/corpus/safetensors/valid", &s));
    CHECK(og_safetensors_count(s) == 3);
    og_safetensors_close(s);
    CHECK_STATUS(og_safetensors_open_file(OG_TEST_DATA_DIR "/no/such.safetensors", &s), OG_ERR_IO);
    CHECK(strstr(og_last_error(), "no/such.safetensors") != NULL);

    /* the sharded checkpoint: 2 layers of 9 tensors, embed, norm, lm_head */
    const char *dir = OG_TEST_DATA_DIR "/hf-synthetic/llama-v4-sharded";
    CHECK_OK(og_safetensors_open_dir(dir, &s));
    CHECK(og_safetensors_count(s) == 21);
    const og_st_tensor *t0 = og_safetensors_find(s, "model.layers.0.self_attn.k_proj.weight");
    const og_st_tensor *t1 = og_safetensors_find(s, "model.layers.1.mlp.down_proj.weight");
    CHECK(t0 && t0->dtype == OG_DTYPE_F16 && t0->shape[0] == 16 && t0->shape[1] == 32);
    CHECK(t0 && strstr(t0->file, "model-00001-of-00002.safetensors"));
    CHECK(t1 && t1->shape[0] == 32 && t1->shape[1] == 48 && strstr(t1->file, "model-00002-of-00002"));
    og_safetensors_close(s);

    /* an index whose weight_map points a tensor at the wrong shard */
    char tmp[] = "/tmp/og_st_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    char path[512], cmd[1200];
    snprintf(cmd, sizeof cmd, "cp %s/*.safetensors %s/", dir, tmp);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
    FILE *f = fopen(path, "w");
    fputs("{\"weight_map\":{\"model.norm.weight\":\"model-00001-of-00002.safetensors\","
          "\"lm_head.weight\":\"model-00001-of-00002.safetensors\"}}",
          f);
    fclose(f);
    CHECK_STATUS(og_safetensors_open_dir(tmp, &s), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "weight_map[\"lm_head.weight\"] names model-00001-of-00002.safetensors"));
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"lm_head.weight\":\"model-00009-of-00009.safetensors\"}}", f);
    fclose(f);
    CHECK_STATUS(og_safetensors_open_dir(tmp, &s), OG_ERR_IO);
    CHECK(strstr(og_last_error(), "model-00009-of-00009.safetensors"));
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"lm_head.weight\":\"../x.safetensors\"}}", f);
    fclose(f);
    CHECK_STATUS(og_safetensors_open_dir(tmp, &s), OG_ERR_FORMAT);
    CHECK(strstr(og_last_error(), "not a file name in the checkpoint folder"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    CHECK(system(cmd) == 0);
}

int main(void) {
    test_valid_memory();
    test_refusals();
    test_files();
    return og_test_finish();
}
