/* Lowering a Hugging Face checkpoint (config.json + safetensors, optional
 * tokenizer.json / tokenizer_config.json) to a program file.
 *
 * Per layer i: rms_norm -> q/k/v matmul (+bias) -> (qwen3: head_rms_norm of
 * q and k) -> rope q/k -> update_and_attend -> o matmul -> add residual ->
 * rms_norm -> gate/up matmul -> swiglu -> down matmul -> add; then the final
 * rms_norm and the logits matmul (lm_head, or the embedding table when
 * tied). The KV manifest declares a flat layer for every full-attention
 * layer and a ring (window = sliding_window) for every sliding one; a
 * window that covers the whole max_context is declared flat, which attends
 * over exactly the same keys with less storage. Weights keep their Hugging
 * Face names and are converted to the target dtype tensor by tensor while
 * the file is written; runtime tensors are kv.<layer>.k / kv.<layer>.v. */
#ifndef OG_IMPORT_EXPORT_H
#define OG_IMPORT_EXPORT_H

#include "import/gguf.h"
#include "import/hf_config.h"
#include "import/safetensors.h"
#include "offgraph.h"
#include "program/program.h"

#include <stdbool.h>
#include <stdint.h>

/* max_context default: the config's max_position_embeddings, capped here so
 * that a default export of a 128k-context checkpoint does not promise
 * sessions more than most deployments budget for; --max-context raises it.
 * (The file size does not depend on it: KV storage is never stored.) */
#define OG_EXPORT_DEFAULT_MAX_CONTEXT 32768
#define OG_EXPORT_DEFAULT_INITIAL_CAPACITY 256
#define OG_EXPORT_DEFAULT_MAX_WRITE 512

/* How the matrices (embedding table, matmul weights) choose their dtype. */
typedef enum og_weight_mix {
    OG_MIX_NONE = 0,  /* every matrix in og_export_options.weights            */
    OG_MIX_AS_STORED, /* a GGUF file: every matrix in the quantized type it is
                       * stored in (copied), float ones in dtype             */
    /* llama-quantize's k-quant file types (weight_mix.c has the rules) */
    OG_MIX_Q2_K,
    OG_MIX_Q3_K_S,
    OG_MIX_Q3_K_M,
    OG_MIX_Q3_K_L,
    OG_MIX_Q4_K_S,
    OG_MIX_Q4_K_M,
    OG_MIX_Q5_K_S,
    OG_MIX_Q5_K_M,
    OG_MIX_Q6_K,
    OG_MIX_COUNT
} og_weight_mix;

/* "q4_k_m", ...; "none", "as-stored"; "unknown" otherwise. Static. */
const char *og_weight_mix_name(og_weight_mix mix);
/* One of the llama-quantize names (q2_k, q3_k_s, ..., q6_k); else
 * OG_ERR_INVALID_ARGUMENT naming it. */
og_status og_weight_mix_parse(const char *name, og_weight_mix *out);
/* The type most matrices of a llama-quantize mix get; OG_DTYPE_COUNT for
 * OG_MIX_NONE and OG_MIX_AS_STORED. */
og_dtype og_weight_mix_default(og_weight_mix mix);
/* The dtype of the matrix `name` (a Hugging Face name) with rows of K
 * under a llama-quantize mix, for the model c describes; float_dtype where
 * the rows fit no quantized block (see weight_mix.c). */
og_dtype og_weight_mix_dtype(og_weight_mix mix, const og_hf_config *c, const char *name, int64_t K,
                             og_dtype float_dtype);
/* t itself when rows of K fit its block; else the fallback llama-quantize
 * takes, as offgraph has it (k-quants: q4 for q2_k / q3_k, q8 for the
 * others; then float_dtype for rows not whole groups of 32). */
og_dtype og_kquant_fallback(og_dtype t, int64_t K, og_dtype float_dtype);

typedef struct og_export_options {
    int64_t max_context;      /* 0: min(max_position_embeddings, 32768)      */
    int64_t initial_capacity; /* 0: min(256, max_context)                    */
    int32_t max_write;        /* 0: min(512, max_context)                    */
    /* weight and activation dtype, f32 or bf16; OG_DTYPE_COUNT: the
     * checkpoint's (f16 checkpoints become f32, which holds them exactly) */
    og_dtype dtype;
    og_dtype kv_dtype;        /* f32 or bf16; default bf16                   */
    /* dtype of the embedding table and the matmul weights: q8, q4 or a
     * k-quant quantizes them (og_quantize_rows; a matrix whose rows are not
     * whole blocks takes og_kquant_fallback, biases beside quantized
     * weights become f32, norm weights stay in `dtype`); OG_DTYPE_COUNT
     * (default): `dtype` for a Hugging Face checkpoint, and for a GGUF file
     * with quantized matrices each as stored (OG_MIX_AS_STORED) */
    og_dtype weights;
    /* OG_MIX_NONE (default): `weights` for every matrix; a llama-quantize
     * mix chooses per matrix (and sets `weights` to its main type); a GGUF
     * file with quantized matrices and no `weights` asked is exported
     * OG_MIX_AS_STORED */
    og_weight_mix mix;
    /* refuse a max_context beyond the positions the model was trained for
     * (the config's max_position_embeddings, or what its rope scaling
     * covers); `offgraph export` sets it unless --force-max-context */
    bool check_max_context;
    og_program_progress_fn progress; /* may be NULL                          */
    void *progress_ctx;
} og_export_options;

void og_export_default_options(og_export_options *o);

/* What an export produced, for the command line's summary. */
typedef struct og_export_summary {
    og_hf_family family;
    int32_t n_layers;
    int32_t n_ring_layers;
    int32_t n_state_layers; /* Gated DeltaNet layers: per-session state, no KV */
    int32_t n_skipped;      /* checkpoint tensors not exported (multi-token prediction, vision) */
    int64_t n_params;      /* elements of the weights written (tied counted once) */
    uint64_t weight_bytes; /* bytes of the weights written                   */
    og_dtype dtype, kv_dtype;
    og_dtype weights;      /* the matrices' dtype (dtype, q8, q4, a k-quant; a mix's main one) */
    og_weight_mix mix;     /* the mix that chose them (OG_MIX_NONE: all `weights`) */
    int32_t n_unquantized; /* matrices left in dtype: rows not whole groups */
    int32_t n_fallback;    /* matrices of another quantized type: rows not whole blocks */
    uint32_t matrix_dtypes; /* bit d set: some matrix is of og_dtype d     */
    int64_t max_context, initial_capacity;
    int32_t max_write;
    bool has_tokenizer;
    int64_t trained_context; /* positions the config covers (see check_max_context) */
} og_export_summary;

/* The temp file an export writes before renaming it onto out_path:
 * out_path.tmp (og_export_hf removes a stale one first). */
#define OG_EXPORT_TEMP_SUFFIX ".tmp"

/* Exports the checkpoint folder hf_dir to out_path. Nothing is left at
 * out_path (nor out_path.tmp) on failure. og_last_error() names the file,
 * field or tensor and the value that was wrong. summary may be NULL. */
og_status og_export_hf(const char *hf_dir, const char *out_path, const og_export_options *opts,
                       og_export_summary *summary);

/* Where the lowering takes its weights from: the Hugging Face path gives
 * safetensors tensors, the GGUF path (export_gguf.c) tensors it maps to
 * the same names and shapes. */
typedef struct og_export_source {
    /* The tensor of that Hugging Face name (rank, row-major shape, numel,
     * dtype: f32, bf16 or f16 as it will be read, or q8 / q4 / a k-quant
     * for blocks a fill copies exactly into that layout), or NULL. */
    const og_st_tensor *(*find)(void *ctx, const char *name);
    /* Writes t's numel elements as dst into out (dst float, or dst == the
     * quantized t->dtype); NULL: t->data converted element by element. */
    og_status (*fill)(void *ctx, const og_st_tensor *t, og_dtype dst, void *out);
    void *ctx;
    const char *origin;      /* the checkpoint, in messages             */
    const char *config_name; /* what declares the shapes, in messages    */
    const char *tokenizer_json;   /* embedded when non-NULL             */
    const char *tokenizer_config; /* may be NULL                        */
    /* without a tokenizer: why, recorded in the program's model as
     * "no_tokenizer" (og_model_no_tokenizer_reason), or NULL */
    const char *no_tokenizer;
} og_export_source;

/* Lowers the model cfg describes, with weights from src, to out_path (the
 * common part of og_export_hf and og_export_gguf). */
og_status og_export_program(const og_hf_config *cfg, const og_export_source *src, const char *out_path,
                            const og_export_options *opts, og_export_summary *summary);

/* Exports a GGUF file (llama, qwen2, qwen3; f32, f16, bf16, q8_0, q4_0 and
 * k-quant weights) to out_path; see export_gguf.c. */
og_status og_export_gguf(const char *gguf_path, const char *out_path, const og_export_options *opts,
                         og_export_summary *summary);

/* The tokenizer.json and tokenizer_config.json texts equivalent to the
 * tokenizer.ggml.* metadata of g (owned by the caller: og_free); both NULL
 * when g has no tokenizer (no tokenizer.ggml.model, or "no_vocab"). Byte-level BPE ("gpt2") only; SentencePiece
 * ("llama") and pre-tokenizers other than default, gpt-2, llama-bpe and
 * qwen2 are refused by name. */
og_status og_gguf_tokenizer(const og_gguf *g, char **tok_json, char **tok_config);

#endif
