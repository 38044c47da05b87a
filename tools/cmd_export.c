/* offgraph export: a Hugging Face checkpoint folder or a GGUF file to a
 * program file. */
#include "cli.h"
#include "commands.h"
#include "core/core.h"
#include "import/export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void export_usage(FILE *f) {
    fprintf(f,
            "usage: offgraph export <hf_dir | model.gguf> -o <file> [options]\n\n"
            "Converts a Hugging Face checkpoint (config.json, model.safetensors or a sharded\n"
            "model.safetensors.index.json, tokenizer.json) of the llama, mistral, qwen2 or qwen3\n"
            "family into a program file. KV storage is declared, never stored: the file size\n"
            "does not depend on --max-context.\n\n"
            "A GGUF file (llama.cpp's format, version 2 or 3, little-endian) of the llama, qwen2\n"
            "or qwen3 architecture is read too: f32, f16 and bf16 weights as they are; q8_0,\n"
            "q4_0 and the k-quants q2_K..q6_K kept as q8 / q4 / q2_k..q6_k, each matrix in the\n"
            "type it is stored in (copied exactly; --weights bf16 or f32 dequantizes them);\n"
            "other quantizations (IQ types, q4_1, q5_0, ...) refused by name; the tokenizer\n"
            "from its metadata (byte-level BPE, SentencePiece BPE; none for no_vocab).\n\n"
            "options:\n"
            "  -o, --output <file>       the program file to write (required)\n"
            "  --max-context N           most tokens a session may hold (default: the config's\n"
            "                            max_position_embeddings, at most %d)\n"
            "  --initial-capacity N      rows a flat layer starts with (default %d, or less)\n"
            "  --max-write N             most tokens one step writes (default %d, or less)\n"
            "  --dtype bf16|f32          weights and activations (default: the checkpoint's;\n"
            "                            float16 checkpoints become f32)\n"
            "  --weights <type>          the embedding table and matmul weights (norms stay in\n"
            "                            --dtype): bf16, f32; q8, q4 (groups of %d with an f16\n"
            "                            scale each); q3_k, q4_k, q5_k (every matrix that\n"
            "                            k-quant); or llama-quantize's k-quant mixes q2_k,\n"
            "                            q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m,\n"
            "                            q6_k: each matrix the type that tool gives it, the\n"
            "                            same bytes as it writes (docs/program-format.md)\n"
            "                            (default: --dtype; a GGUF file's matrices as stored)\n"
            "  --kv-dtype bf16|f32|int8|fp8  KV storage (default bf16; int8 and fp8 e4m3 carry a\n"
            "                            scale per token and head; a session may choose another)\n"
            "  --force-max-context       allow a --max-context beyond the positions the model was\n"
            "                            trained for (max_position_embeddings, or its rope scaling)\n"
            "  -h, --help                this text\n",
            OG_EXPORT_DEFAULT_MAX_CONTEXT, OG_EXPORT_DEFAULT_INITIAL_CAPACITY, OG_EXPORT_DEFAULT_MAX_WRITE,
            OG_QUANT_GROUP);
}

static bool parse_count(const char *opt, const char *s, int64_t max, int64_t *out) {
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || v < 1 || v > max) {
        fprintf(stderr, "offgraph export: %s needs an integer in [1, %lld], got \"%s\"\n", opt, (long long)max,
                s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

static bool parse_float_dtype(const char *opt, const char *s, og_dtype *out) {
    if (s && og_dtype_parse(s, out) == OG_OK && (*out == OG_DTYPE_BF16 || *out == OG_DTYPE_F32)) return true;
    fprintf(stderr, "offgraph export: %s must be bf16 or f32, got \"%s\"\n", opt, s ? s : "");
    return false;
}

int og_cmd_export(int argc, char **argv) {
    og_export_options o;
    og_export_default_options(&o);
    const char *in = NULL, *out = NULL;
    bool force = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            export_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!val) break;
            out = argv[++i];
        } else if (!strcmp(a, "--max-context")) {
            if (!parse_count(a, val, INT32_MAX, &n)) return 2;
            o.max_context = n;
            i++;
        } else if (!strcmp(a, "--initial-capacity")) {
            if (!parse_count(a, val, INT32_MAX, &n)) return 2;
            o.initial_capacity = n;
            i++;
        } else if (!strcmp(a, "--max-write")) {
            if (!parse_count(a, val, INT32_MAX, &n)) return 2;
            o.max_write = (int32_t)n;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            if (!parse_float_dtype(a, val, &o.dtype)) return 2;
            i++;
        } else if (!strcmp(a, "--weights")) {
            if (!og_cli_weights("export", val, &o)) return 2;
            i++;
        } else if (!strcmp(a, "--force-max-context")) {
            force = true;
        } else if (!strcmp(a, "--kv-dtype")) {
            if (!val || og_dtype_parse(val, &o.kv_dtype) != OG_OK ||
                (o.kv_dtype != OG_DTYPE_BF16 && o.kv_dtype != OG_DTYPE_F32 && o.kv_dtype != OG_DTYPE_INT8 &&
                 o.kv_dtype != OG_DTYPE_FP8)) {
                fprintf(stderr, "offgraph export: --kv-dtype must be bf16, f32, int8 or fp8, got \"%s\"\n",
                        val ? val : "");
                return 2;
            }
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "offgraph export: unknown option \"%s\"\n\n", a);
            export_usage(stderr);
            return 2;
        } else if (!in) {
            in = a;
        } else {
            fprintf(stderr, "offgraph export: more than one checkpoint (\"%s\", \"%s\")\n", in, a);
            return 2;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "offgraph export: %s\n\n", !in ? "no checkpoint folder or GGUF file given" : "no output file (-o) given");
        export_usage(stderr);
        return 2;
    }
    o.check_max_context = !force;
    const double t0 = og_time_now();
    og_export_summary s;
    og_status rc = og_cli_export(in, out, &o, &s);
    if (rc != OG_OK) {
        fprintf(stderr, "offgraph export: %s\n", og_last_error());
        return 1;
    }
    if (s.max_context > s.trained_context)
        fprintf(stderr,
                "offgraph export: warning: max-context %lld is beyond the %lld positions the model was trained "
                "for; expect poor output past them\n",
                (long long)s.max_context, (long long)s.trained_context);
    char wdesc[160];
    if (s.weights == s.dtype) snprintf(wdesc, sizeof wdesc, "%s", og_dtype_name(s.dtype));
    else if (s.mix == OG_MIX_AS_STORED && s.matrix_dtypes != 1u << s.weights) {
        /* a mixed file: its matrices' types, as stored */
        size_t n = 0;
        for (int d = 0; d < OG_DTYPE_COUNT; d++)
            if (s.matrix_dtypes & 1u << d)
                n += (size_t)snprintf(wdesc + n, sizeof wdesc - n, "%s%s", n ? ", " : "", og_dtype_name((og_dtype)d));
        snprintf(wdesc + n, sizeof wdesc - n, " as stored (norms %s)", og_dtype_name(s.dtype));
    } else if (s.mix != OG_MIX_NONE && s.mix != OG_MIX_AS_STORED)
        snprintf(wdesc, sizeof wdesc, "%s mix (norms %s%s)", og_weight_mix_name(s.mix), og_dtype_name(s.dtype),
                 s.n_unquantized ? ", some matrices too: rows not whole groups" : "");
    else snprintf(wdesc, sizeof wdesc, "%s (norms %s%s%s)", og_dtype_name(s.weights), og_dtype_name(s.dtype),
                  s.n_unquantized ? ", some matrices too: rows not whole groups" : "",
                  s.n_fallback ? "; some matrices q8 or q4: rows not whole super-blocks" : "");
    char layers[96];
    if (s.n_state_layers)
        snprintf(layers, sizeof layers, "%d ring, %d Gated DeltaNet with per-session state", s.n_ring_layers,
                 s.n_state_layers);
    else
        snprintf(layers, sizeof layers, "%d ring", s.n_ring_layers);
    fprintf(stderr,
            "exported %s -> %s: %s, %d layers (%s), %lld parameters, %.1f MB of %s weights, "
            "kv %s, max-context %lld, initial-capacity %lld, max-write %d, tokenizer %s, %.2f s\n",
            in, out, og_hf_family_name(s.family), s.n_layers, layers, (long long)s.n_params, s.weight_bytes / 1e6,
            wdesc, og_dtype_name(s.kv_dtype), (long long)s.max_context, (long long)s.initial_capacity, s.max_write,
            s.has_tokenizer ? "embedded" : "absent", og_time_now() - t0);
    if (s.n_skipped)
        fprintf(stderr,
                "offgraph export: note: %d tensors of the checkpoint were not exported: multi-token prediction "
                "(mtp.*) and vision (model.visual.*) weights; the program reads text only\n",
                s.n_skipped);
    return 0;
}
