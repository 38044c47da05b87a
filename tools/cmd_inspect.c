/* offgraph inspect: what a program file holds, and whether it is valid. */
#include "commands.h"
#include "core/core.h"
#include "program/program.h"

#include <cjson/cJSON.h>
#include <stdio.h>

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: offgraph inspect <file> [--json]\n\n"
               "Validates a program file against every rule and prints the model, its weights,\n"
               "the runtime (KV) tensors it declares, the KV manifest and whether a tokenizer is\n"
               "embedded. Exits 1 when the file is invalid, naming the rule it breaks.\n");
}

static void shape_str(const og_program_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int64_t numel(const og_program_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

static void print_text(const char *path, const og_program *p) {
    const og_program_model *m = og_program_get_model(p);
    const og_kv_config *kv = og_program_kv_config(p);
    printf("file: %s (%llu bytes)\nvalid: yes\n", path, (unsigned long long)og_program_file_size(p));
    printf("model: %s, vocab %lld, hidden %lld, intermediate %lld, %d layers, %d heads / %d kv heads, head_dim %d\n",
           m->family, (long long)m->vocab_size, (long long)m->hidden_size, (long long)m->intermediate_size,
           m->num_hidden_layers, m->num_attention_heads, m->num_key_value_heads, m->head_dim);
    printf("       rms_norm_eps %g, tied embeddings %s, rope %s theta %g", m->rms_norm_eps,
           m->tie_word_embeddings ? "yes" : "no", og_rope_type_name(m->rope.type), m->rope.theta);
    if (m->rope.type != OG_ROPE_DEFAULT) printf(" factor %g", m->rope.factor);
    if (m->rope.type == OG_ROPE_LLAMA3)
        printf(" low/high freq %g/%g original %lld", m->rope.low_freq_factor, m->rope.high_freq_factor,
               (long long)m->rope.original_max_position_embeddings);
    printf(", activations %s\n", og_dtype_name(m->activation_dtype));
    int64_t params = 0;
    int32_t n_weights = 0;
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        if (t->binding == OG_BINDING_WEIGHT) {
            params += numel(t);
            n_weights++;
        }
    }
    printf("weights: %d tensors, %lld parameters, %llu bytes\n", n_weights, (long long)params,
           (unsigned long long)og_program_weight_bytes(p));
    printf("runtime tensors (bound per session at step time):\n");
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        if (t->binding != OG_BINDING_RUNTIME) continue;
        char sh[96];
        shape_str(t, sh, sizeof sh);
        printf("  %-12s %-4s %-22s 0 bytes stored\n", t->name, og_dtype_name(t->dtype), sh);
    }
    printf("kv manifest: version %d, kv_dtype %s, max_capacity %lld, initial_capacity %lld, max_write %d\n",
           kv->version, og_dtype_name(kv->kv_dtype), (long long)kv->max_capacity, (long long)kv->initial_capacity,
           kv->max_write);
    for (int32_t i = 0; i < kv->n_layers; i++) {
        const og_kv_layer_config *l = &kv->layers[i];
        printf("  layer %-3d %-4s window %-6d kv heads %-3d head_dim %-4d slots %lld\n", l->layer_id,
               l->policy == OG_KV_RING ? "ring" : "flat", l->window, l->n_kv_heads, l->head_dim,
               (long long)og_kv_layer_slots(kv, l));
    }
    for (int32_t i = 0; i < kv->n_states; i++) {
        const og_kv_state_config *st = &kv->states[i];
        char sh[96] = "[";
        for (int32_t d = 0; d < st->rank; d++)
            snprintf(sh + strlen(sh), sizeof sh - strlen(sh), "%s%lld", d ? ", " : "", (long long)st->shape[d]);
        strncat(sh, "]", sizeof sh - strlen(sh) - 1);
        printf("  layer %-3d state %-10.*s %s %s, per session, fixed\n", st->layer_id, (int)sizeof st->name, st->name,
               og_dtype_name(st->dtype), sh);
    }
    const char *tok = og_program_tokenizer_json(p);
    if (tok) printf("tokenizer: embedded (%zu bytes%s)\n", strlen(tok), og_program_tokenizer_config(p) ? ", with config" : "");
    else printf("tokenizer: absent\n");
    printf("instructions: %d\n", og_program_n_instrs(p));
}

static cJSON *json_report(const char *path, const og_program *p) {
    const og_program_model *m = og_program_get_model(p);
    const og_kv_config *kv = og_program_kv_config(p);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "file", path);
    cJSON_AddBoolToObject(r, "valid", 1);
    cJSON_AddNumberToObject(r, "file_bytes", (double)og_program_file_size(p));
    cJSON *jm = cJSON_AddObjectToObject(r, "model");
    cJSON_AddStringToObject(jm, "family", m->family);
    cJSON_AddNumberToObject(jm, "vocab_size", (double)m->vocab_size);
    cJSON_AddNumberToObject(jm, "hidden_size", (double)m->hidden_size);
    cJSON_AddNumberToObject(jm, "intermediate_size", (double)m->intermediate_size);
    cJSON_AddNumberToObject(jm, "num_hidden_layers", m->num_hidden_layers);
    cJSON_AddNumberToObject(jm, "num_attention_heads", m->num_attention_heads);
    cJSON_AddNumberToObject(jm, "num_key_value_heads", m->num_key_value_heads);
    cJSON_AddNumberToObject(jm, "head_dim", m->head_dim);
    cJSON_AddStringToObject(jm, "activation_dtype", og_dtype_name(m->activation_dtype));
    int64_t params = 0;
    cJSON *rt = cJSON_CreateArray(), *wt = cJSON_CreateArray();
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        const bool weight = t->binding == OG_BINDING_WEIGHT;
        if (weight) params += numel(t);
        cJSON *jt = cJSON_CreateObject();
        cJSON_AddStringToObject(jt, "name", t->name);
        cJSON_AddStringToObject(jt, "dtype", og_dtype_name(t->dtype));
        cJSON *sh = cJSON_AddArrayToObject(jt, "shape");
        for (int32_t d = 0; d < t->rank; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddNumberToObject(jt, weight ? "nbytes" : "bytes_stored", weight ? (double)t->nbytes : 0);
        cJSON_AddItemToArray(weight ? wt : rt, jt);
    }
    cJSON_AddNumberToObject(r, "parameters", (double)params);
    cJSON_AddNumberToObject(r, "weight_bytes", (double)og_program_weight_bytes(p));
    cJSON_AddItemToObject(r, "weights", wt);
    cJSON_AddItemToObject(r, "runtime_tensors", rt);
    cJSON *jk = cJSON_AddObjectToObject(r, "kv");
    cJSON_AddStringToObject(jk, "kv_dtype", og_dtype_name(kv->kv_dtype));
    cJSON_AddNumberToObject(jk, "max_capacity", (double)kv->max_capacity);
    cJSON_AddNumberToObject(jk, "initial_capacity", (double)kv->initial_capacity);
    cJSON_AddNumberToObject(jk, "max_write", kv->max_write);
    cJSON *jl = cJSON_AddArrayToObject(jk, "layers");
    for (int32_t i = 0; i < kv->n_layers; i++) {
        const og_kv_layer_config *l = &kv->layers[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer_id", l->layer_id);
        cJSON_AddStringToObject(o, "policy", l->policy == OG_KV_RING ? "ring" : "flat");
        cJSON_AddNumberToObject(o, "window", l->window);
        cJSON_AddNumberToObject(o, "n_kv_heads", l->n_kv_heads);
        cJSON_AddNumberToObject(o, "head_dim", l->head_dim);
        cJSON_AddNumberToObject(o, "slots", (double)og_kv_layer_slots(kv, l));
        cJSON_AddItemToArray(jl, o);
    }
    if (kv->n_states > 0) {
        cJSON *js = cJSON_AddArrayToObject(jk, "states");
        for (int32_t i = 0; i < kv->n_states; i++) {
            const og_kv_state_config *st = &kv->states[i];
            char name[sizeof st->name + 1] = "";
            memcpy(name, st->name, sizeof st->name);
            cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
            cJSON_AddNumberToObject(o, "layer_id", st->layer_id);
            cJSON_AddStringToObject(o, "name", name);
            cJSON_AddStringToObject(o, "dtype", og_dtype_name(st->dtype));
            for (int32_t d = 0; d < st->rank; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)st->shape[d]));
            cJSON_AddItemToObject(o, "shape", sh);
            cJSON_AddItemToArray(js, o);
        }
    }
    cJSON_AddBoolToObject(r, "tokenizer", og_program_tokenizer_json(p) != NULL);
    cJSON_AddNumberToObject(r, "instructions", og_program_n_instrs(p));
    return r;
}

int og_cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "offgraph inspect: unexpected argument \"%s\"\n\n", argv[i]);
            inspect_usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }
    og_program *p = NULL;
    og_status rc = og_program_open(path, &p);
    if (rc != OG_OK) {
        og_program_rule rule = og_program_last_rule(NULL);
        const char *rname = rule == OG_PROGRAM_RULE_NONE ? "-" : og_program_rule_name(rule);
        if (json) {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "file", path);
            cJSON_AddBoolToObject(r, "valid", 0);
            cJSON_AddStringToObject(r, "rule", rname);
            cJSON_AddStringToObject(r, "error", og_last_error());
            char *s = cJSON_Print(r);
            if (s) puts(s);
            cJSON_free(s);
            cJSON_Delete(r);
        } else {
            printf("file: %s\nvalid: no (rule %s)\nerror: %s\n", path, rname, og_last_error());
        }
        return 1;
    }
    if (json) {
        cJSON *r = json_report(path, p);
        char *s = r ? cJSON_Print(r) : NULL;
        if (s) puts(s);
        cJSON_free(s);
        cJSON_Delete(r);
    } else {
        print_text(path, p);
    }
    og_program_close(p);
    return 0;
}
