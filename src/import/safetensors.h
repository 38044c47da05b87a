/* safetensors reader: the weight files of Hugging Face checkpoints.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}), then the data; offsets are relative to the first
 * byte after the header. Files are mapped read-only; tensor pointers point
 * into the mapping. A checkpoint may be one file (model.safetensors) or
 * several shards listed by model.safetensors.index.json ("weight_map":
 * {tensor name: shard file name}).
 *
 * Every refusal is OG_ERR_FORMAT (or OG_ERR_IO / OG_ERR_UNSUPPORTED) with
 * og_last_error() naming the file, the tensor and the rule that failed. */
#ifndef OG_IMPORT_SAFETENSORS_H
#define OG_IMPORT_SAFETENSORS_H

#include "offgraph.h"

#include <stddef.h>
#include <stdint.h>

#define OG_ST_MAX_RANK 8
/* Largest header accepted, as in the reference implementation. */
#define OG_ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct og_st_tensor {
    const char *name;  /* owned by the og_safetensors                    */
    og_dtype dtype;    /* F32, BF16 or F16                               */
    int32_t rank;
    int64_t shape[OG_ST_MAX_RANK];
    int64_t numel;     /* product of shape (1 for rank 0)                */
    const void *data;  /* numel elements, read-only, in the mapping      */
    size_t nbytes;     /* numel * element size                           */
    const char *file;  /* the file it came from; owned by the og_safetensors */
} og_st_tensor;

typedef struct og_safetensors og_safetensors;

/* Opens one .safetensors file. On success *out is owned by the caller:
 * og_safetensors_close. */
og_status og_safetensors_open_file(const char *path, og_safetensors **out);

/* Opens the weights of a checkpoint folder: model.safetensors.index.json
 * (sharded) when present, model.safetensors otherwise. Every weight_map
 * entry must be found in the shard it names. Owned by the caller. */
og_status og_safetensors_open_dir(const char *dir, og_safetensors **out);

/* Parses an in-memory file (for tests and fuzzing). The buffer is borrowed
 * and must outlive the handle; `origin` names it in messages. Owned by the
 * caller: og_safetensors_close. */
og_status og_safetensors_open_memory(const void *data, size_t size, const char *origin,
                                     og_safetensors **out);

/* Unmaps every file and frees the handle. NULL is a no-op. */
void og_safetensors_close(og_safetensors *st);

/* Number of tensors over every file. */
int64_t og_safetensors_count(const og_safetensors *st);
/* Tensor i in [0, count), sorted by name; NULL when out of range. Borrowed. */
const og_st_tensor *og_safetensors_at(const og_safetensors *st, int64_t i);
/* The tensor of that name, or NULL. Borrowed. */
const og_st_tensor *og_safetensors_find(const og_safetensors *st, const char *name);

#endif
