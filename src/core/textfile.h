/* Whole-file reads of the small text files of a checkpoint (config.json,
 * the safetensors index, tokenizer files). */
#ifndef OG_CORE_TEXTFILE_H
#define OG_CORE_TEXTFILE_H

#include "offgraph.h"

#include <stddef.h>

/* Reads path into a NUL-terminated buffer; *len (if non-NULL) gets the byte
 * count without the NUL. On success *out is owned by the caller: og_free.
 * OG_ERR_IO names the file and the reason. */
og_status og_read_text_file(const char *path, char **out, size_t *len);

#endif
