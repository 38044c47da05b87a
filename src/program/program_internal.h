/* Internals shared by the reader, the validator and the writer. */
#ifndef OG_PROGRAM_INTERNAL_H
#define OG_PROGRAM_INTERNAL_H

#include "core/core.h"
#include "program/program.h"

struct og_program {
    const uint8_t *data; /* the whole file, [size] bytes                 */
    size_t size;
    void *map;           /* the mapping when opened from a path, else NULL */
    uint64_t payload_offset, payload_bytes;

    cJSON *root;              /* the parsed manifest; names point into it */
    const cJSON *model_json;
    og_program_model model;
    og_kv_config kv;
    og_kv_layer_config *layers; /* [kv.n_layers] */
    og_kv_state_config *states; /* [kv.n_states] */

    og_program_tensor *tensors; /* [n_tensors] */
    int32_t n_tensors;
    og_program_instr *instrs;   /* [n_instrs]  */
    int32_t n_instrs;
    int32_t logits_instr;

    const char *tokenizer_json, *tokenizer_config; /* into root, or NULL */
    uint64_t weight_bytes;
};

/* Parses and validates p->data[0, p->size) into p. On failure sets the
 * thread's last rule and error and returns OG_ERR_FORMAT (or
 * OG_ERR_OUT_OF_MEMORY); p is then left for og_program_close to free. */
og_status og_program_parse(og_program *p);

/* Sets the thread's last rule. */
void og_program_set_last_rule(og_program_rule r, og_kv_rule kv);


/* Header field offsets. */
#define OG_HDR_VERSION 8
#define OG_HDR_FLAGS 12
#define OG_HDR_MANIFEST_LEN 16
#define OG_HDR_PAYLOAD_OFFSET 24
#define OG_HDR_PAYLOAD_BYTES 32

/* The declared slot count of a manifest layer: flat max_capacity, ring
 * window + max_write - 1 (computed here so the program does not depend on
 * the KV manager for its geometry checks). */
int64_t og_program_layer_slots(const og_kv_config *cfg, const og_kv_layer_config *l);

#endif /* OG_PROGRAM_INTERNAL_H */
