/* The program file (DESIGN.md section 4, byte layout in docs/program-format.md):
 * a writer for exporters, a reader that maps weights read-only and validates
 * every rule, and per-session deferred bindings of the runtime (KV) tensors.
 * The program itself never holds KV pointers and never executes anything. */
#ifndef OG_PROGRAM_H
#define OG_PROGRAM_H

#include "offgraph.h"
#include "program/ops.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ format */

#define OG_PROGRAM_MAGIC "OGPROG\n\x1a" /* 8 bytes, no terminator counted */
#define OG_PROGRAM_MAGIC_SIZE 8
#define OG_PROGRAM_FORMAT_VERSION 1
#define OG_PROGRAM_HEADER_SIZE 40
#define OG_PROGRAM_ALIGN 64 /* payload offset and every weight offset */
#define OG_PROGRAM_MAX_RANK 4

/* ------------------------------------------------------------ rules */

/* Every validation rule; a refused file names exactly one. */
typedef enum og_program_rule {
    OG_PROGRAM_RULE_NONE = 0,
    OG_PROGRAM_RULE_MAGIC,                 /* first 8 bytes are the magic              */
    OG_PROGRAM_RULE_VERSION,               /* header and manifest format_version known */
    OG_PROGRAM_RULE_HEADER,                /* flags 0, lengths/offsets fit the file    */
    OG_PROGRAM_RULE_MANIFEST_JSON,         /* manifest parses to a JSON object         */
    OG_PROGRAM_RULE_REQUIRED_FIELD,        /* a required field is present              */
    OG_PROGRAM_RULE_FIELD_TYPE,            /* a field has the right JSON type          */
    OG_PROGRAM_RULE_FIELD_VALUE,           /* a field's value is in range / known      */
    OG_PROGRAM_RULE_TENSOR_NAME_UNIQUE,    /* no two tensors share a name              */
    OG_PROGRAM_RULE_DTYPE_KNOWN,           /* dtype names are known                    */
    OG_PROGRAM_RULE_SHAPE_RANK,            /* 1 <= rank <= OG_PROGRAM_MAX_RANK         */
    OG_PROGRAM_RULE_SHAPE_POSITIVE,        /* every dim > 0                            */
    OG_PROGRAM_RULE_SHAPE_OVERFLOW,        /* element and byte counts fit in int64     */
    OG_PROGRAM_RULE_PAYLOAD_SIZE,          /* nbytes == elements * dtype size          */
    OG_PROGRAM_RULE_PAYLOAD_BOUNDS,        /* offset + nbytes within the payload       */
    OG_PROGRAM_RULE_PAYLOAD_ALIGNED,       /* offset % OG_PROGRAM_ALIGN == 0           */
    OG_PROGRAM_RULE_PAYLOAD_OVERLAP,       /* no two weights share bytes               */
    OG_PROGRAM_RULE_RUNTIME_NO_PAYLOAD,    /* runtime tensors have no offset/nbytes    */
    OG_PROGRAM_RULE_RUNTIME_MATCHES_LAYER, /* runtime tensor names one manifest layer  */
    OG_PROGRAM_RULE_LAYER_HAS_KV,          /* every manifest layer has a k and a v     */
    OG_PROGRAM_RULE_RUNTIME_SHAPE,         /* runtime [slots, Hkv, D] of kv_dtype      */
    OG_PROGRAM_RULE_LAYER_ID,              /* KV layer ids unique, < num_hidden_layers */
    OG_PROGRAM_RULE_KV_MANIFEST,           /* og_kv_config_validate (see kv rule)      */
    OG_PROGRAM_RULE_GRAPH_INPUTS,          /* inputs are tokens and positions, [T] i32 */
    OG_PROGRAM_RULE_UNKNOWN_OP,            /* instruction op is known                  */
    OG_PROGRAM_RULE_OPERAND_COUNT,         /* number of inputs fits the op             */
    OG_PROGRAM_RULE_OPERAND_EXISTS,        /* operand is an input/tensor/earlier output */
    OG_PROGRAM_RULE_OPERAND_SHAPE,         /* operand shapes/dtypes fit the op's rule  */
    OG_PROGRAM_RULE_ATTR_VALUE,            /* op attributes in range                   */
    OG_PROGRAM_RULE_VALUE_NAME_UNIQUE,     /* an output name is not already a value    */
    OG_PROGRAM_RULE_GRAPH_OUTPUTS,         /* outputs: logits [T, vocab] produced      */
    OG_PROGRAM_RULE_QUANT_SHAPE,           /* q8/q4: [N, K], K % OG_QUANT_GROUP == 0; k-quants: K % 256 == 0 */
    OG_PROGRAM_RULE_LAYER_HAS_STATE,       /* every manifest state has its runtime tensor */
    OG_PROGRAM_RULE_STATE_USED_ONCE,       /* every state tensor is an operand of exactly one instruction */
    OG_PROGRAM_RULE_COUNT
} og_program_rule;

/* Static name, e.g. "payload_overlap"; never NULL. */
const char *og_program_rule_name(og_program_rule r);

/* The rule that refused the last og_program_open* / og_program_validate* on
 * this thread (OG_PROGRAM_RULE_NONE after a success or a non-format error).
 * For OG_PROGRAM_RULE_KV_MANIFEST, *kv_rule (if non-NULL) gets the KV rule;
 * otherwise OG_KV_RULE_NONE. */
og_program_rule og_program_last_rule(og_kv_rule *kv_rule);

/* ------------------------------------------------------------ model */

typedef struct og_program_rope {
    double theta;
    og_rope_type type;
    double factor;           /* 1 when unscaled */
    double low_freq_factor;  /* llama3          */
    double high_freq_factor; /* llama3          */
    int64_t original_max_position_embeddings;
} og_program_rope;

/* Dimension limits of this build, for the manifest's "model" object and for
 * config.json (import/hf_config.c): a file that declares more is refused at
 * parse time, naming the field, before anything is sized from it. Each is
 * far above any released model's (vocabularies of 262144, hidden sizes of
 * 18432, 128 heads of 256), yet keeps every product the executor forms
 * (rows x width, heads x head_dim, max_write x vocab) well inside int64. */
#define OG_MAX_VOCAB ((int64_t)1 << 24)        /* vocab_size                 */
#define OG_MAX_HIDDEN ((int64_t)1 << 20)       /* hidden_size                */
#define OG_MAX_INTERMEDIATE ((int64_t)1 << 22) /* intermediate_size          */
#define OG_MAX_LAYERS 1024                     /* num_hidden_layers          */
#define OG_MAX_HEADS 65536                     /* attention and KV heads     */
#define OG_MAX_HEAD_DIM 65536                  /* head_dim                   */
#define OG_MAX_ATTN_WIDTH ((int64_t)1 << 22)   /* heads x head_dim           */
#define OG_MAX_EXPERTS 4096                    /* num_experts (moe)          */

/* Model hyper-parameters (the manifest's "model" object). */
typedef struct og_program_model {
    char family[32];          /* e.g. "llama", "qwen3"                 */
    og_dtype activation_dtype;/* dtype of every instruction output      */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int32_t num_hidden_layers;
    int32_t num_attention_heads;
    int32_t num_key_value_heads;
    int32_t head_dim;
    double rms_norm_eps;
    bool tie_word_embeddings;
    og_program_rope rope;
} og_program_model;

/* ------------------------------------------------------------ tensors */

typedef enum og_program_binding {
    OG_BINDING_WEIGHT = 0, /* bytes in the payload                  */
    OG_BINDING_RUNTIME = 1 /* KV storage, bound per session per step */
} og_program_binding;

typedef enum og_kv_part { OG_KV_PART_K = 0, OG_KV_PART_V = 1 } og_kv_part;

typedef struct og_program_tensor {
    const char *name; /* owned by the program                              */
    og_dtype dtype;
    int32_t rank;
    int64_t shape[OG_PROGRAM_MAX_RANK];
    og_program_binding binding;
    /* weight: offset into the payload, byte count, and the mapped bytes
     * (borrowed from the program, read-only); runtime: 0, 0, NULL */
    uint64_t offset;
    uint64_t nbytes;
    const void *data;
    /* runtime KV: the manifest layer (index into kv.layers and its
     * layer_id) and which half; runtime state: -1, the state's layer_id;
     * weight: -1, -1, OG_KV_PART_K */
    int32_t kv_index;
    int32_t layer_id;
    og_kv_part part;
    /* runtime state: its index into kv.states; else -1 */
    int32_t state_index;
} og_program_tensor;

/* ------------------------------------------------------- instructions */

/* What an operand names. */
typedef enum og_value_kind {
    OG_VALUE_TENSOR = 0, /* index into the tensor table                      */
    OG_VALUE_INPUT,      /* graph input: 0 = tokens, 1 = positions            */
    OG_VALUE_ACTIVATION  /* the output of the instruction with this index    */
} og_value_kind;

#define OG_INPUT_TOKENS 0
#define OG_INPUT_POSITIONS 1

typedef struct og_program_operand {
    og_value_kind kind;
    int32_t index;
} og_program_operand;

typedef struct og_program_instr {
    og_op op;
    int32_t n_in;
    og_program_operand in[OG_OP_MAX_INPUTS];
    const char *out;       /* output name, owned by the program */
    int64_t out_width;     /* the output is [T, out_width] of activation_dtype */
    og_op_attrs attrs;
    int32_t kv_index;      /* update_and_attend: its manifest layer; else -1 */
} og_program_instr;

/* ------------------------------------------------------------ reader */

typedef struct og_program og_program;

/* Maps the file read-only, parses and validates its manifest against every
 * rule. Runtime tensors stay unbound. On success *out is owned by the caller
 * (og_program_close). On failure returns OG_ERR_IO (cannot read) or
 * OG_ERR_FORMAT with og_last_error() = "program rule <name>: <what, where>"
 * and og_program_last_rule() naming the rule. */
og_status og_program_open(const char *path, og_program **out);
/* The same over a caller's buffer, which is borrowed: it must outlive the
 * program and stay unchanged. Weight pointers point into it. */
og_status og_program_open_memory(const void *data, size_t size, og_program **out);
/* Unmaps and frees. NULL is a no-op. */
void og_program_close(og_program *p);

/* Borrowed from the program; valid until og_program_close. */
const og_program_model *og_program_get_model(const og_program *p);
/* The whole "model" object, including fields the struct does not carry. */
const cJSON *og_program_model_json(const og_program *p);
/* The KV manifest; layers point into the program. n_model_layers is set to
 * num_hidden_layers. Ready for og_kv_session_create. */
const og_kv_config *og_program_kv_config(const og_program *p);

int32_t og_program_n_tensors(const og_program *p);
/* NULL when i is out of range. */
const og_program_tensor *og_program_tensor_at(const og_program *p, int32_t i);
/* Index of the tensor with this name, -1 if none. */
int32_t og_program_find_tensor(const og_program *p, const char *name);

int32_t og_program_n_instrs(const og_program *p);
/* NULL when i is out of range. */
const og_program_instr *og_program_instr_at(const og_program *p, int32_t i);
/* Index of the instruction producing the output "logits". */
int32_t og_program_logits_instr(const og_program *p);
/* A printable name for an operand ("tokens", a tensor name, an output name);
 * borrowed from the program. */
const char *og_program_operand_name(const og_program *p, og_program_operand o);

/* tokenizer.json / tokenizer_config.json texts, NUL-terminated; NULL when
 * absent. Borrowed from the program. */
const char *og_program_tokenizer_json(const og_program *p);
const char *og_program_tokenizer_config(const og_program *p);

/* The bytes before the payloads (magic, version, manifest: everything that
 * describes the program); *size gets their count. Borrowed from the program.
 * A saved session hashes them to know the program it was saved from. */
const void *og_program_header_bytes(const og_program *p, size_t *size);

/* Sum of the weight tensors' nbytes. */
uint64_t og_program_weight_bytes(const og_program *p);
/* Maps in every page of a program opened from a file, so that the first
 * step does not pay for page faults on the weights (executors call it;
 * inspecting a file does not need it). A no-op for memory programs. */
void og_program_prefault(const og_program *p);

/* Size of the file (or buffer) the program was opened from. */
uint64_t og_program_file_size(const og_program *p);

/* ------------------------------------------------------------ writer */

typedef struct og_program_writer og_program_writer;

/* Supplies exactly nbytes of a weight into dst when the payload is written. */
typedef og_status (*og_program_fill_fn)(void *ctx, void *dst, size_t nbytes);
/* Reports progress while finishing; a non-OK return cancels the write. */
typedef og_status (*og_program_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Starts a program that finish will write to path. On success *out is owned
 * by the caller: og_program_writer_destroy. Nothing is written until finish. */
og_status og_program_writer_create(const char *path, og_program_writer **out);
/* Frees the writer; an unfinished program leaves no file. NULL is a no-op. */
void og_program_writer_destroy(og_program_writer *w);
/* Message of the writer's last failure; never NULL; owned by the writer. */
const char *og_program_writer_last_error(const og_program_writer *w);

/* Sets the hyper-parameters. extra (may be NULL) is a JSON object whose
 * members are added to "model" (e.g. bos/eos ids); the writer takes
 * ownership of it in every case, also on failure. */
og_status og_program_writer_set_model(og_program_writer *w, const og_program_model *m,
                                      cJSON *extra);
/* Sets the KV manifest (copied, layers included). */
og_status og_program_writer_set_kv(og_program_writer *w, const og_kv_config *cfg);
/* Adds a weight; fill(ctx, dst, nbytes) is called during finish (ctx must
 * live until then). shape is copied. */
og_status og_program_writer_add_weight(og_program_writer *w, const char *name, og_dtype dtype,
                                       int32_t rank, const int64_t *shape,
                                       og_program_fill_fn fill, void *ctx);
/* Adds a weight whose bytes are in memory (borrowed until finish). */
og_status og_program_writer_add_weight_bytes(og_program_writer *w, const char *name,
                                             og_dtype dtype, int32_t rank, const int64_t *shape,
                                             const void *bytes);
/* Adds one runtime tensor for manifest layer layer_id. */
og_status og_program_writer_add_runtime(og_program_writer *w, const char *name, og_dtype dtype,
                                        int32_t rank, const int64_t *shape, int32_t layer_id,
                                        og_kv_part part);
/* Adds "kv.<layer_id>.k" and ".v" for every layer of the KV manifest (set
 * first), with the declared shape [slots, Hkv, D] and kv_dtype, and
 * "state.<layer_id>.<name>" for every state, of its declared dtype and shape. */
og_status og_program_writer_add_kv_runtime(og_program_writer *w);
/* Appends an instruction; in[] names operands (graph input, tensor or an
 * earlier output); only the attrs the op's table row names are written. */
og_status og_program_writer_add_instr(og_program_writer *w, og_op op, const char *const *in,
                                      int32_t n_in, const char *out, const og_op_attrs *attrs);
/* Stores tokenizer texts (copied); config may be NULL. */
og_status og_program_writer_set_tokenizer(og_program_writer *w, const char *tokenizer_json,
                                          const char *tokenizer_config);
/* Writes <path>.tmp, validates it with the reader's rules, then renames it
 * onto path. On any failure neither path nor <path>.tmp remains. progress
 * may be NULL. */
og_status og_program_writer_finish(og_program_writer *w, og_program_progress_fn progress,
                                   void *ctx);

/* ----------------------------------------------------------- bindings */

/* A per-session table of runtime-tensor bindings. */
typedef struct og_program_bindings og_program_bindings;

/* All runtime tensors unbound. p is borrowed and must outlive the table.
 * On success *out is owned by the caller: og_program_bindings_destroy. */
og_status og_program_bindings_create(const og_program *p, og_program_bindings **out);
void og_program_bindings_destroy(og_program_bindings *b);
/* Binds every runtime tensor to s's storage (og_kv_session_layer_view).
 * A layer with no storage yet (never prepared) stays unbound. s must have
 * been created from a manifest matching the program's (same layers in the
 * same order, same geometry): OG_ERR_INVALID_ARGUMENT otherwise. The storage
 * dtype may differ from the declared kv_dtype (bf16 or f32): it is the
 * session's choice (offgraph eval --kv-dtype), and kernels read the dtype
 * from the session's layer view. The match is checked when b is bound to a
 * session other than the last one it matched, and not again for that one
 * (a session's manifest never changes): the executor binds a session's own
 * table to it before every step, and frees both together. */
og_status og_program_bind_kv(og_program_bindings *b, const og_kv_session *s);
/* Marks every runtime tensor unbound. */
void og_program_bindings_clear(og_program_bindings *b);
/* OG_OK when every runtime tensor is bound; OG_ERR_UNBOUND naming the
 * first unbound one otherwise. */
og_status og_program_bindings_check(og_program_bindings *b);
/* The storage bound to tensor index i ([rows, Hkv, D] of kv_dtype; for a
 * state, its committed copy), NULL when unbound or not a runtime tensor;
 * *rows (if non-NULL) gets the bound rows (0 for a state). Borrowed from
 * the session. */
void *og_program_binding_get(const og_program_bindings *b, int32_t i, int64_t *rows);
/* For a state tensor: the copy the step writes (og_kv_state_view.write), NULL otherwise. */
void *og_program_binding_get_write(const og_program_bindings *b, int32_t i);
/* Message of the last failure; never NULL; owned by the table. */
const char *og_program_bindings_last_error(const og_program_bindings *b);

#endif /* OG_PROGRAM_H */
