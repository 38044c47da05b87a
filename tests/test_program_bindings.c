/* Deferred binding: a freshly loaded program's table is unbound and refused;
 * binding a session that was never prepared leaves it unbound; after a
 * prepare it binds exactly the session's storage (checked against
 * og_kv_session_layer_view); sessions get separate tables; the program
 * itself never holds a KV pointer. */
#include "harness.h"
#include "program_fixture.h"

#include <string.h>

static void check_program_holds_no_kv(const og_program *p) {
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        if (t->binding == OG_BINDING_RUNTIME) CHECK_MSG(t->data == NULL, "program holds a pointer for %s", t->name);
    }
}

int main(void) {
    og_program *p = NULL;
    CHECK_OK(og_program_open(OG_TEST_DATA_DIR "/program/valid.ogp", &p));
    if (!p) return og_test_finish();

    og_test_section("a fresh table is unbound and refused");
    og_program_bindings *b1 = NULL, *b2 = NULL;
    CHECK_OK(og_program_bindings_create(p, &b1));
    CHECK_STATUS(og_program_bindings_check(b1), OG_ERR_UNBOUND);
    CHECK_MSG(strstr(og_program_bindings_last_error(b1), "\"kv.0.k\"") != NULL, "message: %s",
              og_program_bindings_last_error(b1));
    int32_t k0 = og_program_find_tensor(p, "kv.0.k");
    CHECK(og_program_binding_get(b1, k0, NULL) == NULL);

    og_test_section("a session never prepared binds nothing");
    og_kv_session *s1 = NULL, *s2 = NULL;
    CHECK_OK(og_kv_session_create(og_program_kv_config(p), NULL, &s1));
    CHECK_OK(og_kv_session_create(og_program_kv_config(p), NULL, &s2));
    CHECK_OK(og_program_bind_kv(b1, s1));
    CHECK_STATUS(og_program_bindings_check(b1), OG_ERR_UNBOUND);

    og_test_section("after prepare, every runtime tensor is the session's storage");
    CHECK_OK(og_kv_session_prepare(s1, 3));
    CHECK_OK(og_program_bind_kv(b1, s1));
    CHECK_OK(og_program_bindings_check(b1));
    for (int32_t i = 0; i < og_program_n_tensors(p); i++) {
        const og_program_tensor *t = og_program_tensor_at(p, i);
        int64_t rows = -1;
        void *got = og_program_binding_get(b1, i, &rows);
        if (t->binding != OG_BINDING_RUNTIME) {
            CHECK(got == NULL && rows == 0);
            continue;
        }
        og_kv_layer_view v;
        CHECK_OK(og_kv_session_layer_view(s1, t->kv_index, &v));
        CHECK_MSG(got == (t->part == OG_KV_PART_K ? v.k : v.v) && got != NULL, "%s bound elsewhere", t->name);
        CHECK(rows == v.rows && rows > 0 && rows <= t->shape[0]);
        CHECK(v.layer_id == t->layer_id);
    }
    /* the ring layer holds exactly R = W + max_write - 1 rows */
    int64_t ring_rows = 0;
    og_program_binding_get(b1, og_program_find_tensor(p, "kv.1.k"), &ring_rows);
    CHECK(ring_rows == OG_FIX_WINDOW + OG_FIX_MAX_WRITE - 1);
    check_program_holds_no_kv(p);

    og_test_section("a second session gets its own storage in its own table");
    CHECK_OK(og_program_bindings_create(p, &b2));
    CHECK_OK(og_kv_session_prepare(s2, 1));
    CHECK_OK(og_program_bind_kv(b2, s2));
    CHECK_OK(og_program_bindings_check(b2));
    CHECK(og_program_binding_get(b2, k0, NULL) != og_program_binding_get(b1, k0, NULL));
    og_kv_layer_view v1;
    CHECK_OK(og_kv_session_layer_view(s1, 0, &v1));
    CHECK(og_program_binding_get(b1, k0, NULL) == v1.k);

    og_test_section("a session of another manifest is refused and binds nothing");
    og_kv_layer_config other_layers[2] = {{0, OG_KV_FLAT, 0, OG_FIX_KV_HEADS, OG_FIX_HEAD_DIM},
                                          {1, OG_KV_FLAT, 0, OG_FIX_KV_HEADS, OG_FIX_HEAD_DIM}};
    og_kv_config other = *og_program_kv_config(p);
    other.layers = other_layers;
    og_kv_session *s3 = NULL;
    CHECK_OK(og_kv_session_create(&other, NULL, &s3));
    CHECK_OK(og_kv_session_prepare(s3, 1));
    og_program_bindings_clear(b2);
    CHECK_STATUS(og_program_bind_kv(b2, s3), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_program_bindings_check(b2), OG_ERR_UNBOUND);
    /* the match is remembered per session: a refused one stays refused, the
     * matched one binds again */
    CHECK_STATUS(og_program_bind_kv(b2, s3), OG_ERR_INVALID_ARGUMENT);
    CHECK_OK(og_program_bind_kv(b2, s2));
    CHECK_OK(og_program_bindings_check(b2));
    og_program_bindings_clear(b2);
    CHECK_STATUS(og_program_bind_kv(b2, s3), OG_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(og_program_bindings_check(b2), OG_ERR_UNBOUND);

    og_test_section("clear unbinds");
    og_program_bindings_clear(b1);
    CHECK_STATUS(og_program_bindings_check(b1), OG_ERR_UNBOUND);
    check_program_holds_no_kv(p);

    og_kv_session_destroy(s1);
    og_kv_session_destroy(s2);
    og_kv_session_destroy(s3);
    og_program_bindings_destroy(b1);
    og_program_bindings_destroy(b2);
    og_program_close(p);
    return og_test_finish();
}
