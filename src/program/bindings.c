/* Deferred binding: a per-session table that points each runtime tensor of a
 * program at the storage a KV session holds for its layer. The program never
 * sees these pointers; the executor checks the table before every step. */
#include "program/program_internal.h"

#include "kv/kv.h"

typedef struct binding {
    void *data;   /* [rows, Hkv, D] of the session's kv dtype (a state: its committed copy), NULL when unbound */
    int64_t rows;
    void *write;  /* a state: the copy a step writes */
} binding;

struct og_program_bindings {
    const og_program *prog;
    binding *slots; /* [n_tensors]; only runtime tensors are ever bound */
    /* the runtime tensors' indices, in order: a step binds and checks
     * these alone, not every tensor of the program */
    int32_t *runtime; /* [n_runtime] */
    int32_t n_runtime;
    /* the session whose layers and states last matched the program's:
     * binding it again skips the check (a session's manifest never changes) */
    const og_kv_session *matched;
    og_errbuf err;
};

og_status og_program_bindings_create(const og_program *p, og_program_bindings **out) {
    if (!p || !out) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_bindings_create: NULL argument");
    og_program_bindings *b = og_calloc(1, sizeof *b);
    if (b && p->n_tensors > 0 &&
        (!(b->slots = og_calloc((size_t)p->n_tensors, sizeof *b->slots)) ||
         !(b->runtime = og_calloc((size_t)p->n_tensors, sizeof *b->runtime)))) {
        og_program_bindings_destroy(b);
        b = NULL;
    }
    if (!b) return og_set_error(OG_ERR_OUT_OF_MEMORY, "program bindings: out of memory");
    b->prog = p;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].binding == OG_BINDING_RUNTIME) b->runtime[b->n_runtime++] = i;
    *out = b;
    return OG_OK;
}

void og_program_bindings_destroy(og_program_bindings *b) {
    if (!b) return;
    og_free(b->slots);
    og_free(b->runtime);
    og_free(b);
}

void og_program_bindings_clear(og_program_bindings *b) {
    if (!b || !b->slots) return;
    for (int32_t j = 0; j < b->n_runtime; j++) b->slots[b->runtime[j]] = (binding){0};
}

/* Every layer and state of s against the program's manifest; on success b
 * remembers s as matched. */
static og_status check_match(og_program_bindings *b, const og_kv_session *s) {
    const og_program *p = b->prog;
    for (int32_t l = 0; l < p->kv.n_layers; l++) {
        og_kv_layer_view v;
        const og_kv_layer_config *want = &p->layers[l];
        if (og_kv_session_layer_view(s, l, &v) != OG_OK)
            return og_errbuf_set(&b->err, OG_ERR_INVALID_ARGUMENT,
                                 "program bindings: the session has no layer %d (the program's kv.layers[%d])", l, l);
        if (v.layer_id != want->layer_id || v.policy != want->policy || v.window != want->window ||
            v.n_kv_heads != want->n_kv_heads || v.head_dim != want->head_dim ||
            (v.dtype != OG_DTYPE_BF16 && v.dtype != OG_DTYPE_F32 && v.dtype != OG_DTYPE_INT8 &&
             v.dtype != OG_DTYPE_FP8))
            return og_errbuf_set(&b->err, OG_ERR_INVALID_ARGUMENT,
                                 "program bindings: session layer %d (layer_id %d, Hkv %d, D %d, %s) does not match "
                                 "the program's kv.layers[%d] (layer_id %d, Hkv %d, D %d, %s)",
                                 l, v.layer_id, v.n_kv_heads, v.head_dim, og_dtype_name(v.dtype), l, want->layer_id,
                                 want->n_kv_heads, want->head_dim, og_dtype_name(p->kv.kv_dtype));
    }
    const int32_t n_states = og_kv_session_config(s)->n_states;
    if (n_states != p->kv.n_states)
        return og_errbuf_set(&b->err, OG_ERR_INVALID_ARGUMENT,
                             "program bindings: the session has %d states, the program's manifest %d", (int)n_states,
                             (int)p->kv.n_states);
    for (int32_t i = 0; i < p->kv.n_states; i++) {
        const og_kv_state_config *want = &p->states[i];
        og_kv_state_view v;
        og_kv_session_state_view(s, i, &v);
        if (v.layer_id != want->layer_id || strncmp(v.name, want->name, sizeof want->name) || v.dtype != want->dtype ||
            v.rank != want->rank || memcmp(v.shape, want->shape, sizeof v.shape))
            return og_errbuf_set(&b->err, OG_ERR_INVALID_ARGUMENT,
                                 "program bindings: session state %d (layer_id %d, \"%s\") does not match the program's "
                                 "kv.states[%d] (layer_id %d)",
                                 (int)i, (int)v.layer_id, v.name, (int)i, (int)want->layer_id);
    }
    b->matched = s;
    return OG_OK;
}

og_status og_program_bind_kv(og_program_bindings *b, const og_kv_session *s) {
    if (!b || !s) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_bind_kv: NULL argument");
    const og_program *p = b->prog;
    if (b->matched != s) OG_TRY(check_match(b, s)); /* a mismatch binds nothing */
    for (int32_t j = 0; j < b->n_runtime; j++) {
        const int32_t i = b->runtime[j];
        const og_program_tensor *t = &p->tensors[i];
        if (t->state_index >= 0) {
            og_kv_state_view v;
            og_kv_session_state_view(s, t->state_index, &v);
            b->slots[i] = (binding){v.read, 0, v.write};
            continue;
        }
        og_kv_layer_view v;
        og_kv_session_layer_view(s, t->kv_index, &v);
        void *data = t->part == OG_KV_PART_K ? v.k : v.v;
        b->slots[i] = (binding){data, data ? v.rows : 0, NULL};
    }
    return OG_OK;
}

og_status og_program_bindings_check(og_program_bindings *b) {
    if (!b) return og_set_error(OG_ERR_INVALID_ARGUMENT, "og_program_bindings_check: NULL table");
    const og_program *p = b->prog;
    for (int32_t j = 0; j < b->n_runtime; j++) {
        const int32_t i = b->runtime[j];
        const og_program_tensor *t = &p->tensors[i];
        if (!b->slots[i].data)
            return og_errbuf_set(&b->err, OG_ERR_UNBOUND,
                                 "program bindings: runtime tensor \"%s\" (layer %d %s) is unbound", t->name,
                                 t->layer_id, t->state_index >= 0 ? "state" : t->part == OG_KV_PART_K ? "k" : "v");
    }
    return OG_OK;
}

void *og_program_binding_get(const og_program_bindings *b, int32_t i, int64_t *rows) {
    if (rows) *rows = 0;
    if (!b || i < 0 || i >= b->prog->n_tensors || !b->slots[i].data) return NULL;
    if (rows) *rows = b->slots[i].rows;
    return b->slots[i].data;
}

void *og_program_binding_get_write(const og_program_bindings *b, int32_t i) {
    if (!b || i < 0 || i >= b->prog->n_tensors) return NULL;
    return b->slots[i].write;
}

const char *og_program_bindings_last_error(const og_program_bindings *b) { return b ? b->err.msg : ""; }
