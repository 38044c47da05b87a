/* Small helpers shared by the sub-commands: option values and files. */
#ifndef OG_TOOLS_CLI_H
#define OG_TOOLS_CLI_H

#include "offgraph.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Parses an integer option value in [lo, hi]; prints "offgraph <cmd>: <flag>
 * ..." and returns false when it is not one. */
bool og_cli_int(const char *cmd, const char *flag, const char *value, int64_t lo, int64_t hi, int64_t *out);
/* The value after argv[*i] (advancing *i), or NULL with a message. */
const char *og_cli_value(const char *cmd, int argc, char **argv, int *i);
/* The whole of stream f (what names it in a message), NUL-terminated, its
 * length in *len (may be NULL); owned by the caller: free. NULL after a
 * message naming cmd and what. */
char *og_cli_read_stream(const char *cmd, FILE *f, const char *what, size_t *len);
/* The whole of the file at path, as og_cli_read_stream. */
char *og_cli_read_file(const char *cmd, const char *path);
/* Parses token ids: "1,2 3" inline, or "@path" to read them from a file;
 * separators are commas and whitespace. On success *ids (owned by the
 * caller: free) holds *n ids. */
bool og_cli_tokens(const char *cmd, const char *spec, int32_t **ids, int64_t *n);
/* Writes bytes to path through path.tmp and a rename: no half-written file. */
bool og_cli_write_file(const char *cmd, const char *path, const void *data, size_t bytes);
/* Parses "bf16" / "f32" as a KV dtype. */
bool og_cli_kv_dtype(const char *cmd, const char *value, og_dtype *out);
/* Parses "auto" / "cpu" / "cuda". */
bool og_cli_backend(const char *cmd, const char *value, og_backend *out);
/* The options every command that runs a model takes. */
typedef struct og_cli_model_opts {
    const char *model;          /* -m, --model                      */
    og_backend backend;         /* --backend                        */
    int threads;                /* --threads (0: every online CPU)  */
    og_session_params session;  /* --kv-dtype                       */
} og_cli_model_opts;
void og_cli_model_opts_default(og_cli_model_opts *o);
/* If argv[*i] is one of those options, reads it (advancing *i) and returns
 * 1; 0 if it is none of them; -1 (after a message) when its value is bad. */
int og_cli_model_option(const char *cmd, int argc, char **argv, int *i, og_cli_model_opts *o);
/* Their help lines. */
void og_cli_model_opts_usage(FILE *f);
/* Loads a model, printing the reason on failure. */
og_model *og_cli_load_model(const char *cmd, const char *path, og_backend backend, int threads);

#endif
