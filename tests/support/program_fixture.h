/* A small synthetic program (2 layers: layer 0 flat, layer 1 ring) written
 * with the program writer, and the broken variants of it, one per
 * validation rule. Shared by the program tests and the generator
 * tests/tools/make_broken_programs.c. */
#ifndef OG_TEST_PROGRAM_FIXTURE_H
#define OG_TEST_PROGRAM_FIXTURE_H

#include "program/program.h"

#include <stddef.h>
#include <stdint.h>

/* Geometry of the synthetic model. */
#define OG_FIX_VOCAB 32
#define OG_FIX_HIDDEN 16
#define OG_FIX_FFN 24
#define OG_FIX_HEADS 4
#define OG_FIX_KV_HEADS 2
#define OG_FIX_HEAD_DIM 4
#define OG_FIX_WINDOW 4
#define OG_FIX_MAX_WRITE 8

typedef struct og_fixture_opts {
    int64_t max_capacity;   /* 0 means 64 */
    int32_t fail_fill_at;   /* 1-based weight whose fill fails; 0 = none */
    bool with_tokenizer;
    /* Geometry and dtypes for the executor tests; 0 (false) keeps the
     * defaults above, so the bytes of a default program never change. */
    og_dtype activation_dtype; /* OG_DTYPE_F32 (0, default) or OG_DTYPE_BF16 */
    bool kv_f32;               /* the program's kv_dtype f32 (default bf16) */
    og_dtype kv_quant;         /* OG_DTYPE_INT8 or OG_DTYPE_FP8: the program's
                                  kv_dtype (any other value: as kv_f32 says) */
    int64_t initial_capacity;  /* 0 means 16                                */
    int32_t max_write;         /* 0 means OG_FIX_MAX_WRITE                  */
    int32_t window;            /* the ring layer's W; 0 means OG_FIX_WINDOW */
    /* Weights for running the program (the default ones, uniform in
     * [-1, 1), blow activations up to infinity within two layers, and the
     * f32 bias of the bf16 v projection is read as bf16 by the kernels):
     * matrices scaled by 1/sqrt(in features), norm weights 1 +- 0.25, the
     * bias bf16 +- 0.1. og_fixture_weight_bytes gives the default weights
     * only. */
    bool well_scaled;
} og_fixture_opts;

/* Writes the synthetic program to path through the writer. */
og_status og_fixture_write_program(const char *path, const og_fixture_opts *o);

/* The expected bytes of weight tensor `name` (deterministic in the name):
 * fills dst[nbytes]. */
void og_fixture_weight_bytes(const char *name, og_dtype dt, void *dst, size_t nbytes);

/* The KV manifest the fixture writes (layers point to static storage). */
og_kv_config og_fixture_kv_config(int64_t max_capacity);

/* One broken variant per rule. */
typedef struct og_broken_case {
    const char *file;          /* file name under tests/data/program/broken/ */
    og_program_rule rule;
    og_kv_rule kv_rule;        /* for OG_PROGRAM_RULE_KV_MANIFEST */
} og_broken_case;
/* The table of cases, *n gets its length. Static. */
const og_broken_case *og_broken_cases(int *n);

/* Builds broken case i from the valid file's bytes. On success *out
 * (owned by the caller: free) holds *out_size bytes. */
og_status og_broken_build(int i, const uint8_t *valid, size_t valid_size, uint8_t **out, size_t *out_size);

/* The valid program with layer 0's MLP a mixture of 3 experts (top 2), the
 * base of the moe broken cases (owned by the caller: free). */
og_status og_fixture_moe_program(const uint8_t *valid, size_t valid_size, uint8_t **out, size_t *out_size);

/* Reads a whole file (owned by the caller: free); NULL on failure. */
uint8_t *og_fixture_read_file(const char *path, size_t *size);

#endif
