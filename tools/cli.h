/* Small helpers shared by the sub-commands: option values and files. */
#ifndef OG_TOOLS_CLI_H
#define OG_TOOLS_CLI_H

#include "import/export.h"
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
    const char *model;          /* -m, --model: a program, a checkpoint folder or a GGUF file */
    og_backend backend;         /* --backend, -ngl                  */
    int threads;                /* -t, --threads (0: every online CPU) */
    int tensor_parallel;        /* -tp, --tensor-parallel (0: one shard) */
    int n_devices;              /* --devices: CUDA device ordinals, one a shard (0: the current one) */
    int devices[OG_TENSOR_PARALLEL_MAX];
    og_session_params session;  /* --kv-dtype                       */
    int64_t ctx;                /* -c, --ctx-size: most tokens a session holds (0: the program's) */
    int64_t batch;              /* -b, --batch-size (0: the command's default) */
    const char *weights;        /* --weights: a checkpoint's matrices in the cached export (NULL: default) */
} og_cli_model_opts;
/* Defaults. o becomes the options og_cli_load_model applies (-c, --weights):
 * one command runs per process, and its options live as long as it does. */
void og_cli_model_opts_default(og_cli_model_opts *o);
/* If argv[*i] is one of those options, reads it (advancing *i) and returns
 * 1; 0 if it is none of them; -1 (after a message) when its value is bad. */
int og_cli_model_option(const char *cmd, int argc, char **argv, int *i, og_cli_model_opts *o);
/* Their help lines. */
void og_cli_model_opts_usage(FILE *f);
/* --devices into the model's parameters (o may be NULL: none). */
void og_cli_devices(const og_cli_model_opts *o, og_model_params *mp);
/* Loads a model, printing the reason on failure. A checkpoint folder or a
 * GGUF file is exported into the cache first (og_cli_resolve_model); the
 * options of og_cli_model_opts_default's struct apply: -c bounds the
 * context (og_model_set_context), --weights chooses the export's. */
og_model *og_cli_load_model(const char *cmd, const char *path, og_backend backend, int threads);

/* ---- exporting: offgraph export, and -m naming a checkpoint ------------- */

/* A regular file that starts with the GGUF magic. */
bool og_cli_is_gguf(const char *path);
/* Parses --weights (bf16, f32, q8, q4, q3_k, q4_k, q5_k or a llama-quantize
 * mix, any case) into o->weights / o->mix; false after a message. */
bool og_cli_weights(const char *cmd, const char *value, og_export_options *o);
/* Exports the checkpoint folder or GGUF file `in` to `out` (through
 * out.tmp and a rename), drawing a progress bar on a terminal's stderr and
 * removing the temp file when SIGINT, SIGTERM or SIGHUP ends the process.
 * OFFGRAPH_TEST_EXPORT_STALL=<pct> pauses 30 s at that percentage (the
 * tests' way to kill an export half-way). og_last_error() on failure. */
og_status og_cli_export(const char *in, const char *out, og_export_options *o, og_export_summary *s);
/* What -m names: a program file is itself; a Hugging Face checkpoint
 * folder or a GGUF file is the program exported from it into the cache
 * ($XDG_CACHE_HOME/offgraph, else ~/.cache/offgraph), named by a hash of
 * its path, the names, sizes and modification times of the files it is
 * read from, and the export's options (weights: as --weights, NULL the
 * default; ctx past the export's default context asks an export that
 * holds it). The first start exports it (one process at a time: a lock on
 * the cache folder; through a temp file and a rename, so that an export
 * cut short never leaves a program behind); later starts read it.
 * Returns the path to load (owned by the caller: free), NULL after a
 * message. */
char *og_cli_resolve_model(const char *cmd, const char *path, const char *weights, int64_t ctx);
/* A checkpoint folder or a GGUF file (what og_cli_resolve_model exports). */
bool og_cli_is_checkpoint(const char *path);

/* ---- the options of every command, llama.cpp's names, "did you mean" --- */

/* One option a command takes, as its help text lists it. */
typedef struct og_cli_opt {
    char name[40];
    bool value;     /* takes a value (the next argument) */
} og_cli_opt;
/* The options a help text lists: lines that start (indented by at most
 * four spaces) with "-x" or "--xyz", several names separated by ", ",
 * then, after one space, a value ("<N>", "FILE", "stop|drop"), or two
 * spaces and the description for a flag; and the options of its usage
 * lines ("[--stop S]", "[--stats]"). -h and --help are always there.
 * Returns how many it wrote to opts (at most cap). */
int og_cli_parse_help(const char *help, og_cli_opt *opts, int cap);
/* The name of cands[0..n) closest to what was typed (edit distance, a
 * prefix counting as near), or NULL when none is near enough. */
const char *og_cli_suggest(const char *typed, const char *const *cands, int n);

#endif
