/* KV manifest validation: a valid config passes, and for every rule a
 * config that breaks only that rule is refused naming exactly that rule. */
#include "harness.h"
#include "kv/kv.h"
#include "program_fixture.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include <string.h>

#define N_LAYERS 3

#define N_STATES 2

typedef struct fixture {
    og_kv_layer_config layers[N_LAYERS];
    og_kv_state_config states[N_STATES];
    og_kv_config cfg;
} fixture;

/* A valid manifest: two flat layers and a ring layer, and the two states of
 * a Gated DeltaNet layer (layer 1), 8 model layers. */
static void fixture_init(fixture *f) {
    const og_kv_layer_config layers[N_LAYERS] = {
        {.layer_id = 0, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 2, .head_dim = 8},
        {.layer_id = 3, .policy = OG_KV_RING, .window = 16, .n_kv_heads = 2, .head_dim = 8},
        {.layer_id = 5, .policy = OG_KV_FLAT, .window = 0, .n_kv_heads = 4, .head_dim = 16},
    };
    memcpy(f->layers, layers, sizeof layers);
    f->cfg = (og_kv_config){
        .version = OG_KV_MANIFEST_VERSION,
        .kv_dtype = OG_DTYPE_BF16,
        .max_capacity = 1024,
        .initial_capacity = 16,
        .max_write = 32,
        .n_model_layers = 8,
        .n_layers = N_LAYERS,
        .layers = f->layers,
        .n_states = N_STATES,
        .states = f->states,
    };
    const og_kv_state_config states[N_STATES] = {
        {.layer_id = 1, .name = "conv", .dtype = OG_DTYPE_F32, .rank = 2, .shape = {3, 96}},
        {.layer_id = 1, .name = "recurrent", .dtype = OG_DTYPE_F32, .rank = 3, .shape = {4, 16, 24}},
    };
    memcpy(f->states, states, sizeof states);
}

/* Breaks exactly one rule of a valid fixture. */
static void break_rule(fixture *f, og_kv_rule r) {
    switch (r) {
    case OG_KV_RULE_VERSION: f->cfg.version = 2; break;
    case OG_KV_RULE_KV_DTYPE: f->cfg.kv_dtype = OG_DTYPE_I32; break;
    case OG_KV_RULE_MAX_CAPACITY:
        /* max_capacity <= 0 would also break initial_capacity and max_write,
         * which come later in the order: the first broken rule is reported. */
        f->cfg.max_capacity = 0;
        break;
    case OG_KV_RULE_INITIAL_CAPACITY: f->cfg.initial_capacity = 2048; break;
    case OG_KV_RULE_MAX_WRITE: f->cfg.max_write = 0; break;
    case OG_KV_RULE_LAYER_COUNT: f->cfg.n_layers = 0, f->cfg.n_states = 0; break;
    case OG_KV_RULE_LAYER_ID_RANGE: f->layers[2].layer_id = 8; break;
    case OG_KV_RULE_LAYER_ID_UNIQUE: f->layers[2].layer_id = 3; break;
    case OG_KV_RULE_POLICY: f->layers[1].policy = (og_kv_policy)7; break;
    case OG_KV_RULE_RING_WINDOW: f->layers[1].window = 0; break;
    case OG_KV_RULE_FLAT_WINDOW: f->layers[0].window = 4; break;
    case OG_KV_RULE_KV_HEADS: f->layers[2].n_kv_heads = 0; break;
    case OG_KV_RULE_HEAD_DIM: f->layers[1].head_dim = -1; break;
    case OG_KV_RULE_SIZE_OVERFLOW:
        /* 2^60 rows x 4 heads x 16 dims x 2 bytes overflows; nothing else breaks. */
        f->cfg.max_capacity = (int64_t)1 << 60;
        break;
    case OG_KV_RULE_STATE_OWNER: f->states[1].layer_id = 8; break;
    case OG_KV_RULE_STATE_NAME: memcpy(f->states[1].name, "conv", 5); break; /* layer 1 has a "conv" already */
    case OG_KV_RULE_STATE_DTYPE: f->states[0].dtype = OG_DTYPE_BF16; break;
    case OG_KV_RULE_STATE_SHAPE: f->states[1].shape[2] = 0; break;
    case OG_KV_RULE_NONE:
    case OG_KV_RULE_COUNT: break;
    }
}

static void test_states(void) {
    og_test_section("states: the other ways to break their rules, and a manifest of states only");
    fixture f;
    og_kv_rule broken;
    fixture_init(&f);
    f.states[0].layer_id = -1;
    CHECK(og_kv_config_validate(&f.cfg, &broken) != OG_OK && broken == OG_KV_RULE_STATE_OWNER);
    fixture_init(&f);
    memset(f.states[0].name, 0, sizeof f.states[0].name); /* empty */
    CHECK(og_kv_config_validate(&f.cfg, &broken) != OG_OK && broken == OG_KV_RULE_STATE_NAME);
    fixture_init(&f);
    memset(f.states[0].name, 'x', sizeof f.states[0].name); /* 16 characters: no terminator */
    CHECK(og_kv_config_validate(&f.cfg, &broken) != OG_OK && broken == OG_KV_RULE_STATE_NAME);
    fixture_init(&f);
    f.states[1].rank = 5;
    CHECK(og_kv_config_validate(&f.cfg, &broken) != OG_OK && broken == OG_KV_RULE_STATE_SHAPE);
    fixture_init(&f);
    f.states[1].shape[0] = (int64_t)1 << 40, f.states[1].shape[1] = (int64_t)1 << 20; /* x 24 x 4 bytes x 3 copies */
    CHECK(og_kv_config_validate(&f.cfg, &broken) != OG_OK && broken == OG_KV_RULE_STATE_SHAPE);
    fixture_init(&f);
    f.states[1].layer_id = 2; /* the same name in another layer is fine */
    memcpy(f.states[1].name, "conv", 5);
    CHECK_OK(og_kv_config_validate(&f.cfg, &broken));
    /* a model of Gated DeltaNet layers only: states and no KV layer */
    fixture_init(&f);
    f.cfg.n_layers = 0;
    f.cfg.layers = NULL;
    CHECK_OK(og_kv_config_validate(&f.cfg, &broken));
    f.cfg.n_states = 0;
    CHECK(og_kv_config_validate(&f.cfg, &broken) != OG_OK && broken == OG_KV_RULE_LAYER_COUNT);
    f.cfg.n_states = 1;
    f.cfg.states = NULL;
    CHECK(og_kv_config_validate(&f.cfg, &broken) != OG_OK && broken == OG_KV_RULE_LAYER_COUNT);
}

static void test_valid(void) {
    og_test_section("valid config");
    fixture f;
    fixture_init(&f);
    og_kv_rule broken = OG_KV_RULE_COUNT;
    CHECK_OK(og_kv_config_validate(&f.cfg, &broken));
    CHECK(broken == OG_KV_RULE_NONE);
    CHECK_OK(og_kv_config_validate(&f.cfg, NULL));
    /* Boundaries that are still valid. */
    f.cfg.n_model_layers = 0;
    f.layers[2].layer_id = 1000;
    f.cfg.initial_capacity = f.cfg.max_capacity;
    f.cfg.max_write = (int32_t)f.cfg.max_capacity;
    f.cfg.kv_dtype = OG_DTYPE_F32;
    CHECK_OK(og_kv_config_validate(&f.cfg, &broken));
    CHECK(broken == OG_KV_RULE_NONE);
    /* quantized storage: int8 and fp8; not the weight formats q8 / q4 */
    const og_dtype ok[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8}, refused[3] = {OG_DTYPE_Q8, OG_DTYPE_Q4, OG_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        f.cfg.kv_dtype = ok[i];
        CHECK_MSG(og_kv_config_validate(&f.cfg, &broken) == OG_OK, "kv_dtype %s: %s", og_dtype_name(ok[i]),
                  og_last_error());
    }
    for (int i = 0; i < 3; i++) {
        f.cfg.kv_dtype = refused[i];
        CHECK_STATUS(og_kv_config_validate(&f.cfg, &broken), OG_ERR_INVALID_CONFIG);
        CHECK_MSG(broken == OG_KV_RULE_KV_DTYPE, "kv_dtype %s: rule %s", og_dtype_name(refused[i]),
                  og_kv_rule_name(broken));
    }
}

/* A row of a layer's k or v: Hkv * D elements, or for int8 / fp8 the Hkv * D
 * quant bytes then Hkv f32 scales, padded to 16 bytes; a dense view's stride
 * says the same. */
static void test_row_bytes(void) {
    og_test_section("row bytes and dense strides");
    fixture f;
    fixture_init(&f);
    const og_kv_layer_config *l = &f.layers[0];
    const int64_t HD = (int64_t)l->n_kv_heads * l->head_dim;
    const og_dtype dts[4] = {OG_DTYPE_F32, OG_DTYPE_BF16, OG_DTYPE_INT8, OG_DTYPE_FP8};
    /* 2 heads of 8: 16 quants and 8 bytes of scales, 8 of padding */
    CHECK(HD == 16);
    const int64_t want[4] = {4 * HD, 2 * HD, 32, 32};
    const int64_t want_stride[4] = {HD, HD, 32, 32};
    for (int i = 0; i < 4; i++) {
        f.cfg.kv_dtype = dts[i];
        CHECK_MSG(og_kv_row_bytes(&f.cfg, l) == want[i], "%s: %lld bytes a row, want %lld", og_dtype_name(dts[i]),
                  (long long)og_kv_row_bytes(&f.cfg, l), (long long)want[i]);
        og_kv_layer_view v = {.dtype = dts[i], .n_kv_heads = l->n_kv_heads, .head_dim = l->head_dim};
        CHECK(og_kv_layer_view_row_stride(&v) == want_stride[i]);
        v.row_stride = 1000;
        CHECK(og_kv_layer_view_row_stride(&v) == 1000);
    }
}

static void test_each_rule(void) {
    og_test_section("each rule broken alone");
    for (int r = OG_KV_RULE_VERSION; r < OG_KV_RULE_COUNT; r++) {
        fixture f;
        fixture_init(&f);
        break_rule(&f, (og_kv_rule)r);
        og_kv_rule broken = OG_KV_RULE_NONE;
        og_status st = og_kv_config_validate(&f.cfg, &broken);
        const char *name = og_kv_rule_name((og_kv_rule)r);
        CHECK_MSG(st == OG_ERR_INVALID_CONFIG, "rule %s: status %s", name, og_status_str(st));
        CHECK_MSG(broken == (og_kv_rule)r, "rule %s: reported %s", name, og_kv_rule_name(broken));
        CHECK_MSG(strstr(og_last_error(), name) != NULL, "rule %s: message \"%s\"", name, og_last_error());
        CHECK_MSG(strncmp(og_last_error(), "kv manifest rule ", 17) == 0, "rule %s: message \"%s\"", name,
                  og_last_error());
    }
}

static void test_messages(void) {
    og_test_section("messages name the layer and the value");
    fixture f;
    fixture_init(&f);
    f.layers[1].window = -3;
    og_kv_rule broken;
    CHECK_STATUS(og_kv_config_validate(&f.cfg, &broken), OG_ERR_INVALID_CONFIG);
    CHECK(broken == OG_KV_RULE_RING_WINDOW);
    CHECK_MSG(strstr(og_last_error(), "layer 1") && strstr(og_last_error(), "layer_id 3") &&
                  strstr(og_last_error(), "-3"),
              "%s", og_last_error());

    fixture_init(&f);
    f.layers[2].layer_id = 0;
    CHECK_STATUS(og_kv_config_validate(&f.cfg, &broken), OG_ERR_INVALID_CONFIG);
    CHECK(broken == OG_KV_RULE_LAYER_ID_UNIQUE);
    CHECK_MSG(strstr(og_last_error(), "layer 2") && strstr(og_last_error(), "layer 0"), "%s", og_last_error());

    /* Order: with two rules broken, the earlier one in the enum is reported. */
    fixture_init(&f);
    f.layers[0].head_dim = 0;
    f.layers[2].policy = (og_kv_policy)-1;
    CHECK_STATUS(og_kv_config_validate(&f.cfg, &broken), OG_ERR_INVALID_CONFIG);
    CHECK(broken == OG_KV_RULE_POLICY);

    /* layers == NULL with n_layers set. */
    fixture_init(&f);
    f.cfg.layers = NULL;
    CHECK_STATUS(og_kv_config_validate(&f.cfg, &broken), OG_ERR_INVALID_CONFIG);
    CHECK(broken == OG_KV_RULE_LAYER_COUNT);

    /* Ring R overflowing through the window: W + max_write - 1 slots. */
    fixture_init(&f);
    f.layers[1].window = INT32_MAX;
    f.layers[1].n_kv_heads = INT32_MAX;
    f.layers[1].head_dim = INT32_MAX;
    CHECK_STATUS(og_kv_config_validate(&f.cfg, &broken), OG_ERR_INVALID_CONFIG);
    CHECK(broken == OG_KV_RULE_SIZE_OVERFLOW);
    CHECK_MSG(strstr(og_last_error(), "layer_id 3") != NULL, "%s", og_last_error());

    CHECK_STATUS(og_kv_config_validate(NULL, &broken), OG_ERR_INVALID_ARGUMENT);
    CHECK(broken == OG_KV_RULE_NONE);
}

static void test_names_and_slots(void) {
    og_test_section("rule names and slots");
    CHECK(strcmp(og_kv_rule_name(OG_KV_RULE_RING_WINDOW), "ring_window") == 0);
    CHECK(strcmp(og_kv_rule_name(OG_KV_RULE_SIZE_OVERFLOW), "size_overflow") == 0);
    CHECK(strcmp(og_kv_rule_name(OG_KV_RULE_COUNT), "unknown") == 0);
    CHECK(strcmp(og_kv_rule_name((og_kv_rule)-5), "unknown") == 0);
    /* Every rule has a distinct name. */
    for (int a = 0; a < OG_KV_RULE_COUNT; a++)
        for (int b = 0; b < a; b++) CHECK(strcmp(og_kv_rule_name((og_kv_rule)a), og_kv_rule_name((og_kv_rule)b)) != 0);
    fixture f;
    fixture_init(&f);
    CHECK(og_kv_layer_slots(&f.cfg, &f.layers[0]) == 1024);
    CHECK(og_kv_layer_slots(&f.cfg, &f.layers[1]) == 16 + 32 - 1);
}

/* A program whose manifest says int8 or fp8: it validates and loads, a
 * default session stores its KV so, and its logits are those of the same
 * weights under a bf16 manifest with the session asking for that dtype. */
static void test_program_manifest(void) {
    og_test_section("a program's manifest of int8 / fp8 KV");
    char dir[] = "/tmp/og_test_kv_config_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK_MSG(false, "mkdtemp");
        return;
    }
    char plain[256], quant[256];
    snprintf(plain, sizeof plain, "%s/bf16.ogp", dir);
    snprintf(quant, sizeof quant, "%s/quant.ogp", dir);
    og_fixture_opts o = {.well_scaled = true};
    CHECK_OK(og_fixture_write_program(plain, &o));
    const og_dtype dts[2] = {OG_DTYPE_INT8, OG_DTYPE_FP8};
    const int32_t toks[6] = {3, 1, 4, 1, 5, 9};
    enum { V = OG_FIX_VOCAB };
    for (int d = 0; d < 2; d++) {
        o.kv_quant = dts[d];
        CHECK_OK(og_fixture_write_program(quant, &o));
        og_model_params mp = og_model_default_params();
        mp.backend = OG_BACKEND_CPU;
        mp.n_threads = 1;
        og_model *mq = NULL, *mb = NULL;
        CHECK_OK(og_model_load(quant, &mp, &mq));
        CHECK_OK(og_model_load(plain, &mp, &mb));
        if (!mq || !mb) {
            og_model_destroy(mq);
            og_model_destroy(mb);
            continue;
        }
        CHECK(og_model_kv_config(mq)->kv_dtype == dts[d]);
        og_session *sq = NULL, *sb = NULL;
        CHECK_OK(og_session_create(mq, NULL, &sq)); /* the program's dtype */
        og_session_params sp = og_session_default_params();
        sp.kv_dtype = dts[d];
        CHECK_OK(og_session_create(mb, &sp, &sb));
        if (sq && sb) {
            float lq[6 * V], lb[6 * V];
            CHECK(og_kv_session_config(og_session_kv(sq))->kv_dtype == dts[d]);
            CHECK_OK(og_session_eval(sq, toks, 4, 0, lq, 1)); /* every position's logits */
            CHECK_OK(og_session_eval(sb, toks, 4, 0, lb, 1));
            CHECK_OK(og_session_eval(sq, toks + 4, 1, 0, lq + 4 * V, 0));
            CHECK_OK(og_session_eval(sb, toks + 4, 1, 0, lb + 4 * V, 0));
            bool finite = true;
            for (int i = 0; i < 5 * V; i++) finite = finite && isfinite(lq[i]);
            CHECK_MSG(finite && !memcmp(lq, lb, sizeof(float) * 5 * V),
                      "%s manifest: logits differ from a bf16 manifest's session asking for %s",
                      og_dtype_name(dts[d]), og_dtype_name(dts[d]));
        }
        og_session_destroy(sq);
        og_session_destroy(sb);
        og_model_destroy(mq);
        og_model_destroy(mb);
    }
    remove(plain);
    remove(quant);
    rmdir(dir);
}

int main(void) {
    test_valid();
    test_each_rule();
    test_states();
    test_messages();
    test_names_and_slots();
    test_row_bytes();
    test_program_manifest();
    return og_test_finish();
}
