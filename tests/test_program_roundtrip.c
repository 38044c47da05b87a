/* Writer -> reader on the synthetic 2-layer program (layer 0 flat, layer 1
 * ring): the manifest reads back as written, every weight byte equals the
 * fixture's bytes computed independently, runtime tensors carry no payload,
 * the file size does not depend on max_capacity, and a failing write leaves
 * neither the file nor its .tmp behind. */
#include "harness.h"
#include "program_fixture.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static long long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

static void check_program(const char *path, int64_t max_capacity) {
    og_program *p = NULL;
    CHECK_OK(og_program_open(path, &p));
    if (!p) return;
    const og_program_model *m = og_program_get_model(p);
    CHECK(strcmp(m->family, "llama") == 0);
    CHECK(m->activation_dtype == OG_DTYPE_F32);
    CHECK(m->vocab_size == OG_FIX_VOCAB && m->hidden_size == OG_FIX_HIDDEN && m->intermediate_size == OG_FIX_FFN);
    CHECK(m->num_hidden_layers == 2 && m->num_attention_heads == OG_FIX_HEADS);
    CHECK(m->num_key_value_heads == OG_FIX_KV_HEADS && m->head_dim == OG_FIX_HEAD_DIM);
    CHECK(m->rms_norm_eps == 1e-5 && m->tie_word_embeddings);
    CHECK(m->rope.theta == 500000.0 && m->rope.type == OG_ROPE_LLAMA3 && m->rope.factor == 8.0);
    CHECK(m->rope.low_freq_factor == 1.0 && m->rope.high_freq_factor == 4.0);
    CHECK(m->rope.original_max_position_embeddings == 8192);
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(og_program_model_json(p), "bos_token_id");
    CHECK(cJSON_IsNumber(bos) && bos->valuedouble == 1);

    const og_kv_config *kv = og_program_kv_config(p);
    CHECK(kv->version == OG_KV_MANIFEST_VERSION && kv->kv_dtype == OG_DTYPE_BF16);
    CHECK(kv->max_capacity == max_capacity && kv->initial_capacity == 16 && kv->max_write == OG_FIX_MAX_WRITE);
    CHECK(kv->n_model_layers == 2 && kv->n_layers == 2);
    CHECK(kv->layers[0].layer_id == 0 && kv->layers[0].policy == OG_KV_FLAT && kv->layers[0].window == 0);
    CHECK(kv->layers[1].layer_id == 1 && kv->layers[1].policy == OG_KV_RING && kv->layers[1].window == OG_FIX_WINDOW);
    for (int l = 0; l < 2; l++)
        CHECK(kv->layers[l].n_kv_heads == OG_FIX_KV_HEADS && kv->layers[l].head_dim == OG_FIX_HEAD_DIM);

    /* 1 embed + 11 per layer + final norm, then 4 runtime tensors */
    CHECK(og_program_n_tensors(p) == 1 + 2 * 11 + 1 + 4);
    uint64_t weight_bytes = 0;
    int runtime = 0;
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        CHECK(og_program_find_tensor(p, t->name) == i);
        if (t->binding == OG_BINDING_RUNTIME) {
            runtime++;
            CHECK_MSG(t->data == NULL && t->offset == 0 && t->nbytes == 0, "%s carries a payload", t->name);
            int64_t slots = t->layer_id == 0 ? max_capacity : OG_FIX_WINDOW + OG_FIX_MAX_WRITE - 1;
            CHECK(t->dtype == OG_DTYPE_BF16 && t->rank == 3 && t->shape[0] == slots &&
                  t->shape[1] == OG_FIX_KV_HEADS && t->shape[2] == OG_FIX_HEAD_DIM);
            char want[16];
            snprintf(want, sizeof want, "kv.%d.%s", t->layer_id, t->part == OG_KV_PART_K ? "k" : "v");
            CHECK(strcmp(t->name, want) == 0 && t->kv_index == t->layer_id);
            continue;
        }
        size_t n = og_dtype_size(t->dtype);
        for (int k = 0; k < t->rank; k++) n *= (size_t)t->shape[k];
        CHECK_MSG(t->nbytes == n && t->offset % OG_PROGRAM_ALIGN == 0, "%s: nbytes %llu offset %llu", t->name,
                  (unsigned long long)t->nbytes, (unsigned long long)t->offset);
        uint8_t *want = malloc(n);
        og_fixture_weight_bytes(t->name, t->dtype, want, n);
        CHECK_MSG(t->data && memcmp(t->data, want, n) == 0, "weight %s differs from what was written", t->name);
        CHECK(((uintptr_t)t->data) % OG_PROGRAM_ALIGN == 0);
        free(want);
        weight_bytes += n;
    }
    CHECK(runtime == 4);
    CHECK(og_program_weight_bytes(p) == weight_bytes);
    CHECK((long long)og_program_file_size(p) == file_size(path));
    const og_program_tensor *embed = og_program_tensor_at(p, og_program_find_tensor(p, "embed"));
    CHECK(embed && embed->dtype == OG_DTYPE_BF16 && embed->shape[0] == OG_FIX_VOCAB && embed->shape[1] == OG_FIX_HIDDEN);

    /* instructions: embed, 16 per layer, final norm, logits */
    CHECK(og_program_n_instrs(p) == 1 + 2 * 16 + 2);
    int32_t li = og_program_logits_instr(p);
    CHECK(li == og_program_n_instrs(p) - 1);
    const og_program_instr *lg = og_program_instr_at(p, li);
    CHECK(lg && lg->op == OG_OP_MATMUL && lg->out_width == OG_FIX_VOCAB);
    CHECK(lg && lg->in[1].kind == OG_VALUE_TENSOR && strcmp(og_program_operand_name(p, lg->in[1]), "embed") == 0);
    const og_program_instr *e = og_program_instr_at(p, 0);
    CHECK(e->op == OG_OP_EMBED && e->in[0].kind == OG_VALUE_INPUT && e->in[0].index == OG_INPUT_TOKENS);
    int attends = 0;
    for (int32_t i = 0; i < og_program_n_instrs(p); i++) {
        const og_program_instr *x = og_program_instr_at(p, i);
        for (int k = 0; k < x->n_in; k++)
            if (x->in[k].kind == OG_VALUE_ACTIVATION) CHECK(x->in[k].index < i);
        if (x->op != OG_OP_UPDATE_AND_ATTEND) continue;
        CHECK(x->kv_index == attends && x->attrs.layer_id == attends);
        CHECK(x->attrs.n_heads == OG_FIX_HEADS && x->attrs.n_kv_heads == OG_FIX_KV_HEADS && x->attrs.scale == 0);
        CHECK(x->out_width == OG_FIX_HEADS * OG_FIX_HEAD_DIM);
        CHECK(x->in[4].kind == OG_VALUE_TENSOR && og_program_tensor_at(p, x->in[4].index)->part == OG_KV_PART_K);
        attends++;
    }
    CHECK(attends == 2);
    const og_program_instr *rope = og_program_instr_at(p, 6);
    CHECK(rope->op == OG_OP_ROPE && rope->attrs.rope_type == OG_ROPE_LLAMA3 && rope->attrs.heads == OG_FIX_HEADS &&
          rope->attrs.original_max_position_embeddings == 8192 && rope->attrs.high_freq_factor == 4.0);
    CHECK(og_program_tokenizer_json(p) &&
          strcmp(og_program_tokenizer_json(p), "{\"model\": {\"type\": \"BPE\"}, \"note\": \"caf\xc3\xa9\"}") == 0);
    CHECK(og_program_tokenizer_config(p) && strcmp(og_program_tokenizer_config(p), "{\"bos_token\": \"<s>\"}") == 0);
    og_program_close(p);
}

typedef struct progress_log {
    uint64_t last, total;
    int calls;
    bool monotonic;
    int cancel_at;
} progress_log;

static og_status on_progress(void *ctx, uint64_t done, uint64_t total) {
    progress_log *l = ctx;
    if (done < l->last || done > total) l->monotonic = false;
    l->last = done;
    l->total = total;
    l->calls++;
    return l->cancel_at && l->calls == l->cancel_at ? OG_ERR_STATE : OG_OK;
}

static void check_failure_leaves_nothing(const char *path, og_status got, og_status want, const char *what) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK_MSG(got == want, "%s: got %s, want %s (%s)", what, og_status_str(got), og_status_str(want), og_last_error());
    CHECK_MSG(!exists(path) && !exists(tmp), "%s: a file remains", what);
}

int main(void) {
    char a[400], b[400];
    snprintf(a, sizeof a, "%s/roundtrip_cap128.ogp", OG_BINARY_DIR);
    snprintf(b, sizeof b, "%s/roundtrip_cap32768.ogp", OG_BINARY_DIR);

    og_test_section("write and read back at two capacities");
    og_fixture_opts o = {.max_capacity = 128, .with_tokenizer = true};
    CHECK_OK(og_fixture_write_program(a, &o));
    o.max_capacity = 32768;
    CHECK_OK(og_fixture_write_program(b, &o));
    check_program(a, 128);
    check_program(b, 32768);
    CHECK_MSG(file_size(a) == file_size(b) && file_size(a) > 0, "sizes %lld vs %lld", file_size(a), file_size(b));
    CHECK(file_size(a) < 64 * 1024);

    og_test_section("progress reports the payload, monotonically");
    og_program_writer *w = NULL;
    og_program *src = NULL;
    CHECK_OK(og_program_open(a, &src));
    progress_log pl = {.monotonic = true};
    if (src) {
        /* re-write the program read from a, from its mapped bytes */
        CHECK_OK(og_program_writer_create(b, &w));
        CHECK_OK(og_program_writer_set_model(w, og_program_get_model(src), NULL));
        CHECK_OK(og_program_writer_set_kv(w, og_program_kv_config(src)));
        for (int32_t i = 0; i < og_program_n_tensors(src); i++) {
            const og_program_tensor *t = og_program_tensor_at(src, i);
            if (t->binding == OG_BINDING_WEIGHT)
                CHECK_OK(og_program_writer_add_weight_bytes(w, t->name, t->dtype, t->rank, t->shape, t->data));
        }
        CHECK_OK(og_program_writer_add_kv_runtime(w));
        for (int32_t i = 0; i < og_program_n_instrs(src); i++) {
            const og_program_instr *x = og_program_instr_at(src, i);
            const char *in[OG_OP_MAX_INPUTS];
            for (int k = 0; k < x->n_in; k++) in[k] = og_program_operand_name(src, x->in[k]);
            CHECK_OK(og_program_writer_add_instr(w, x->op, in, x->n_in, x->out, &x->attrs));
        }
        CHECK_OK(og_program_writer_finish(w, on_progress, &pl));
        og_program_writer_destroy(w);
        CHECK(pl.monotonic && pl.calls == 1 + 24 && pl.last == pl.total);
        CHECK(pl.total >= og_program_weight_bytes(src) && pl.total < og_program_weight_bytes(src) + 24 * 64);
        og_program *copy = NULL;
        CHECK_OK(og_program_open(b, &copy));
        for (int32_t i = 0; copy && i < og_program_n_tensors(src); i++) {
            const og_program_tensor *x = og_program_tensor_at(src, i), *y = og_program_tensor_at(copy, i);
            CHECK(strcmp(x->name, y->name) == 0 && x->nbytes == y->nbytes &&
                  (!x->data || memcmp(x->data, y->data, x->nbytes) == 0));
        }
        og_program_close(copy);
        og_program_close(src);
    }
    unlink(a);
    unlink(b);

    og_test_section("failures leave no file and no .tmp");
    char nodir[400];
    snprintf(nodir, sizeof nodir, "%s/no-such-dir/p.ogp", OG_BINARY_DIR);
    check_failure_leaves_nothing(nodir, og_fixture_write_program(nodir, NULL), OG_ERR_IO, "unwritable directory");
    o = (og_fixture_opts){.fail_fill_at = 5};
    check_failure_leaves_nothing(a, og_fixture_write_program(a, &o), OG_ERR_IO, "fill callback failing");
    o.fail_fill_at = 24;
    check_failure_leaves_nothing(a, og_fixture_write_program(a, &o), OG_ERR_IO, "last fill failing");

    /* a cancelled progress, and a program that fails its own validation */
    int64_t shape[2] = {OG_FIX_VOCAB, OG_FIX_HIDDEN};
    static float table[OG_FIX_VOCAB * OG_FIX_HIDDEN];
    og_program_model m = {.family = "llama", .activation_dtype = OG_DTYPE_F32, .vocab_size = OG_FIX_VOCAB,
                          .hidden_size = OG_FIX_HIDDEN, .intermediate_size = OG_FIX_FFN, .num_hidden_layers = 2,
                          .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 4, .rms_norm_eps = 1e-5,
                          .rope = {10000.0, OG_ROPE_DEFAULT, 1.0, 0, 0, 0}};
    og_kv_config kv = og_fixture_kv_config(64);
    for (int variant = 0; variant < 2; variant++) {
        CHECK_OK(og_program_writer_create(a, &w));
        CHECK_OK(og_program_writer_set_model(w, &m, NULL));
        CHECK_OK(og_program_writer_set_kv(w, &kv));
        CHECK_OK(og_program_writer_add_weight_bytes(w, "embed", OG_DTYPE_F32, 2, shape, table));
        CHECK_OK(og_program_writer_add_kv_runtime(w));
        const char *in[2] = {"tokens", "embed"};
        CHECK_OK(og_program_writer_add_instr(w, OG_OP_EMBED, in, 2, "x", NULL));
        if (variant == 0) {
            const char *in2[2] = {"x", "embed"}; /* [T, H] @ [V, H]^T = [T, V] */
            CHECK_OK(og_program_writer_add_instr(w, OG_OP_MATMUL, in2, 2, "logits", NULL));
            progress_log cancel = {.monotonic = true, .cancel_at = 2};
            check_failure_leaves_nothing(a, og_program_writer_finish(w, on_progress, &cancel), OG_ERR_STATE,
                                         "progress cancelling");
        } else {
            /* no instruction produces logits: the writer's own validation refuses */
            check_failure_leaves_nothing(a, og_program_writer_finish(w, NULL, NULL), OG_ERR_FORMAT,
                                         "self-validation");
            CHECK(og_program_last_rule(NULL) == OG_PROGRAM_RULE_GRAPH_OUTPUTS);
            CHECK(strstr(og_program_writer_last_error(w), "graph_outputs") != NULL);
        }
        og_program_writer_destroy(w);
    }

    og_test_section("writer argument checks");
    CHECK_OK(og_program_writer_create(a, &w));
    CHECK_STATUS(og_program_writer_finish(w, NULL, NULL), OG_ERR_STATE);
    CHECK_STATUS(og_program_writer_add_kv_runtime(w), OG_ERR_STATE);
    CHECK_OK(og_program_writer_add_weight_bytes(w, "t", OG_DTYPE_F32, 2, shape, table));
    CHECK_STATUS(og_program_writer_add_weight_bytes(w, "t", OG_DTYPE_F32, 2, shape, table), OG_ERR_INVALID_ARGUMENT);
    int64_t bad[2] = {0, 4};
    CHECK_STATUS(og_program_writer_add_weight_bytes(w, "u", OG_DTYPE_F32, 2, bad, table), OG_ERR_INVALID_ARGUMENT);
    const char *one[1] = {"x"};
    CHECK_STATUS(og_program_writer_add_instr(w, OG_OP_ADD, one, 1, "y", NULL), OG_ERR_INVALID_ARGUMENT);
    og_program_writer_destroy(w);
    CHECK(!exists(a));
    return og_test_finish();
}
