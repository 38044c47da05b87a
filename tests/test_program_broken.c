/* Every committed broken program is refused with OG_ERR_FORMAT and exactly
 * its rule; every rule has a file; the committed files (valid and broken)
 * equal what the generator writes today. */
#include "harness.h"
#include "program/ops.h"
#include "program_fixture.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool same_bytes(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
    return a && b && an == bn && memcmp(a, b, an) == 0;
}

int main(void) {
    og_test_section("the committed valid program equals a fresh write and opens");
    char fresh[256];
    snprintf(fresh, sizeof fresh, "%s/test_program_broken.valid.ogp", OG_BINARY_DIR);
    CHECK_OK(og_fixture_write_program(fresh, NULL));
    size_t vn = 0, fn = 0;
    uint8_t *valid = og_fixture_read_file(OG_TEST_DATA_DIR "/program/valid.ogp", &vn);
    uint8_t *now = og_fixture_read_file(fresh, &fn);
    CHECK_MSG(same_bytes(valid, vn, now, fn), "tests/data/program/valid.ogp is stale: run make_broken_programs");
    unlink(fresh);
    og_program *p = NULL;
    CHECK_OK(og_program_open(OG_TEST_DATA_DIR "/program/valid.ogp", &p));
    CHECK(og_program_last_rule(NULL) == OG_PROGRAM_RULE_NONE);
    og_program_close(p);

    og_test_section("the moe base of the moe_* broken files is valid");
    if (valid) {
        uint8_t *mb = NULL;
        size_t mn = 0;
        CHECK_OK(og_fixture_moe_program(valid, vn, &mb, &mn));
        og_program *mp = NULL;
        CHECK_OK(og_program_open_memory(mb, mn, &mp));
        og_program_close(mp);
        free(mb);
    }

    og_test_section("one broken file per rule, refused by exactly that rule");
    int n;
    const og_broken_case *cases = og_broken_cases(&n);
    bool covered[OG_PROGRAM_RULE_COUNT] = {false};
    for (int i = 0; i < n && valid; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/program/broken/%s", OG_TEST_DATA_DIR, cases[i].file);
        size_t cn = 0, gn = 0;
        uint8_t *committed = og_fixture_read_file(path, &cn), *gen = NULL;
        CHECK_OK(og_broken_build(i, valid, vn, &gen, &gn));
        CHECK_MSG(same_bytes(committed, cn, gen, gn), "%s is missing or stale: run make_broken_programs",
                  cases[i].file);
        og_program *b = NULL;
        og_status st = og_program_open(path, &b);
        og_kv_rule kr;
        og_program_rule r = og_program_last_rule(&kr);
        CHECK_MSG(st == OG_ERR_FORMAT && !b, "%s: status %s", cases[i].file, og_status_str(st));
        CHECK_MSG(r == cases[i].rule && kr == cases[i].kv_rule, "%s: refused by %s/%s (%s)", cases[i].file,
                  og_program_rule_name(r), og_kv_rule_name(kr), og_last_error());
        /* the message names the rule */
        char want[96];
        if (cases[i].rule == OG_PROGRAM_RULE_KV_MANIFEST)
            snprintf(want, sizeof want, "program rule kv_manifest:%s: ", og_kv_rule_name(cases[i].kv_rule));
        else
            snprintf(want, sizeof want, "program rule %s: ", og_program_rule_name(cases[i].rule));
        CHECK_MSG(strncmp(og_last_error(), want, strlen(want)) == 0, "%s: message \"%s\"", cases[i].file,
                  og_last_error());
        /* a dimension over this build's limits (model.<field>.ogp): the
         * message names the field */
        if (!strncmp(cases[i].file, "model.", 6)) {
            char field[64];
            snprintf(field, sizeof field, "\"%.*s\"", (int)(strlen(cases[i].file) - 10), cases[i].file + 6);
            CHECK_MSG(strstr(og_last_error(), field), "%s: message \"%s\" lacks %s", cases[i].file,
                      og_last_error(), field);
        }
        /* the same bytes from memory give the same verdict */
        og_program *m = NULL;
        CHECK_STATUS(og_program_open_memory(committed ? committed : gen, committed ? cn : gn, &m), OG_ERR_FORMAT);
        CHECK(og_program_last_rule(NULL) == cases[i].rule);
        covered[cases[i].rule] = true;
        free(committed);
        free(gen);
    }
    for (int r = 1; r < OG_PROGRAM_RULE_COUNT; r++)
        CHECK_MSG(covered[r], "rule %s has no broken file", og_program_rule_name((og_program_rule)r));

    og_test_section("matmul: a bias of another dtype than the weight's (f32 beside q8/q4) is refused");
    {
        const og_shape x = {.rank = 2, .dim = {OG_DIM_T, 64}, .dtype = OG_DTYPE_F32};
        const og_dtype weight_dtypes[] = {OG_DTYPE_F32, OG_DTYPE_BF16, OG_DTYPE_Q8, OG_DTYPE_Q4};
        const og_dtype bias_dtypes[] = {OG_DTYPE_F32, OG_DTYPE_BF16, OG_DTYPE_F16};
        for (int wi = 0; wi < 4; wi++) {
            const og_dtype want = wi < 2 ? weight_dtypes[wi] : OG_DTYPE_F32;
            const og_shape w = {.rank = 2, .dim = {4, 64}, .dtype = weight_dtypes[wi]};
            for (int k = 0; k < 3; k++) {
                const og_shape in[3] = {x, w, {.rank = 1, .dim = {4}, .dtype = bias_dtypes[k]}};
                const og_op_context ctx = {.act_dtype = OG_DTYPE_F32};
                og_shape out;
                char why[256] = "";
                const og_op_check c = og_op_infer(OG_OP_MATMUL, &(og_op_attrs){0}, in, 3, &ctx, &out, why, sizeof why);
                const bool ok = bias_dtypes[k] == want;
                CHECK_MSG(c == (ok ? OG_OP_CHECK_OK : OG_OP_CHECK_OPERAND), "weight %s, bias %s: check %d (%s)",
                          og_dtype_name(w.dtype), og_dtype_name(bias_dtypes[k]), c, why);
                if (!ok) CHECK_MSG(strstr(why, og_dtype_name(want)) != NULL, "reason \"%s\"", why);
            }
        }
    }

    og_test_section("truncations and a missing file");
    for (size_t cut = 0; valid && cut < vn; cut += cut < 64 ? 7 : 997) {
        og_program *t = NULL;
        CHECK_STATUS(og_program_open_memory(valid, cut, &t), OG_ERR_FORMAT);
        og_program_rule r = og_program_last_rule(NULL);
        CHECK_MSG(r == (cut < 8 ? OG_PROGRAM_RULE_MAGIC : OG_PROGRAM_RULE_HEADER), "cut at %zu: %s", cut,
                  og_program_rule_name(r));
    }
    og_program *none = NULL;
    CHECK_STATUS(og_program_open(OG_TEST_DATA_DIR "/program/no-such-file.ogp", &none), OG_ERR_IO);
    CHECK(og_program_last_rule(NULL) == OG_PROGRAM_RULE_NONE);
    free(valid);
    free(now);
    return og_test_finish();
}
