/* The moe kernels against transformers (tests/data/moe, made by
 * tests/fixtures/make_moe_fixtures.py with transformers 5.17):
 *  - the sparse MoE blocks of Qwen3.5-MoE (top 2 of 8, renormalised, gated
 *    shared expert) and Qwen3-Next (top 3 of 8, not renormalised, gated
 *    shared expert) alone: their input x [24, 64] through the router's
 *    product, the shared expert's SwiGLU MLP and gate (og_matmul_ref,
 *    og_swiglu_ref) and og_moe_ref / og_moe_cpu must give transformers'
 *    output, from either checkpoint layout (one tensor per expert, or the
 *    fused gate_up_proj / down_proj);
 *  - routing ties: og_moe_route_ref picks the experts torch.topk picks on the
 *    GPU for rows of exactly equal probabilities (the same set), and this
 *    records where torch on the CPU picks others (its std::nth_element
 *    order).
 * Whole-model parity (Qwen3-MoE, both layouts, decoder_sparse_step) is
 * tests/cli_parity.sh over tests/data/hf/qwen3-moe*. */
#include "harness.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "import/safetensors.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static float *f32_of(const og_st_tensor *t) {
    float *o = malloc(sizeof(float) * (size_t)t->numel);
    for (int64_t i = 0; i < t->numel; i++)
        o[i] = t->dtype == OG_DTYPE_F16 ? og_f32_from_f16(((const og_f16 *)t->data)[i]) : og_load_f32(t->data, t->dtype, (size_t)i);
    return o;
}

static const og_st_tensor *need(og_safetensors *st, const char *name) {
    const og_st_tensor *t = og_safetensors_find(st, name);
    CHECK_MSG(t != NULL, "tensor %s missing", name);
    return t;
}

static void check_block(const char *name, bool fused) {
    char path[512], jpath[512];
    snprintf(path, sizeof path, "%s/moe/%s%s.safetensors", OG_TEST_DATA_DIR, name, fused ? ".fused" : "");
    snprintf(jpath, sizeof jpath, "%s/moe/%s.json", OG_TEST_DATA_DIR, name);
    char *js = og_test_read_file(jpath);
    cJSON *info = js ? cJSON_Parse(js) : NULL;
    og_safetensors *st = NULL;
    CHECK_OK(og_safetensors_open_file(path, &st));
    if (!info || !st) {
        CHECK_MSG(false, "%s: fixture missing", name);
        return;
    }
    const int64_t H = cJSON_GetObjectItem(info, "hidden_size")->valueint, E = cJSON_GetObjectItem(info, "num_experts")->valueint,
                  F = cJSON_GetObjectItem(info, "moe_intermediate_size")->valueint,
                  S = cJSON_GetObjectItem(info, "shared_expert_intermediate_size")->valueint,
                  T = cJSON_GetObjectItem(info, "T")->valueint;
    const int32_t k = cJSON_GetObjectItem(info, "num_experts_per_tok")->valueint;
    const bool norm = cJSON_IsTrue(cJSON_GetObjectItem(info, "norm_topk_prob"));
    float *x = f32_of(need(st, "x")), *want = f32_of(need(st, "out")), *router = f32_of(need(st, "mlp.gate.weight"));
    /* the stacks [E, 2F, H] and [E, H, F] in f32, from either layout */
    float *gu = malloc(sizeof(float) * (size_t)(E * 2 * F * H)), *dn = malloc(sizeof(float) * (size_t)(E * H * F));
    if (fused) {
        float *a = f32_of(need(st, "mlp.experts.gate_up_proj")), *b = f32_of(need(st, "mlp.experts.down_proj"));
        memcpy(gu, a, sizeof(float) * (size_t)(E * 2 * F * H));
        memcpy(dn, b, sizeof(float) * (size_t)(E * H * F));
        free(a), free(b);
    } else {
        for (int64_t e = 0; e < E; e++) {
            char n[128];
            static const char *const parts[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int j = 0; j < 3; j++) {
                snprintf(n, sizeof n, "mlp.experts.%lld.%s.weight", (long long)e, parts[j]);
                float *p = f32_of(need(st, n));
                if (j < 2) memcpy(gu + (e * 2 + j) * F * H, p, sizeof(float) * (size_t)(F * H));
                else memcpy(dn + e * H * F, p, sizeof(float) * (size_t)(H * F));
                free(p);
            }
        }
    }
    float *lg = malloc(sizeof(float) * (size_t)(T * E)), *sh = NULL, *sg = NULL;
    CHECK_OK(og_matmul_ref(x, router, NULL, OG_DTYPE_F32, T, H, E, lg));
    if (S > 0) {
        float *wg = f32_of(need(st, "mlp.shared_expert.gate_proj.weight")),
              *wu = f32_of(need(st, "mlp.shared_expert.up_proj.weight")),
              *wd = f32_of(need(st, "mlp.shared_expert.down_proj.weight")),
              *wsg = f32_of(need(st, "mlp.shared_expert_gate.weight"));
        float *g = malloc(sizeof(float) * (size_t)(T * S)), *u = malloc(sizeof(float) * (size_t)(T * S));
        sh = malloc(sizeof(float) * (size_t)(T * H));
        sg = malloc(sizeof(float) * (size_t)T);
        CHECK_OK(og_matmul_ref(x, wg, NULL, OG_DTYPE_F32, T, H, S, g));
        CHECK_OK(og_matmul_ref(x, wu, NULL, OG_DTYPE_F32, T, H, S, u));
        CHECK_OK(og_swiglu_ref(g, u, T, S, g));
        CHECK_OK(og_matmul_ref(g, wd, NULL, OG_DTYPE_F32, T, S, H, sh));
        CHECK_OK(og_matmul_ref(x, wsg, NULL, OG_DTYPE_F32, T, H, 1, sg));
        free(wg), free(wu), free(wd), free(wsg), free(g), free(u);
    }
    float *out = malloc(sizeof(float) * (size_t)(T * H));
    og_moe_args a = {.x = x, .logits = lg, .gate_up = gu, .gate_up_dtype = OG_DTYPE_F32, .down = dn,
                     .down_dtype = OG_DTYPE_F32, .shared = sh, .shared_gate = sg, .T = T, .H = H, .F = F, .E = E,
                     .top_k = k, .norm_topk_prob = norm, .out = out};
    /* f32 on both sides; transformers' sums run in other orders (its
     * products through oneDNN/MKL): outputs of magnitude ~1 agree to a few
     * 1e-6; 1e-4 catches any wrong expert, weight or missing term */
    og_poison(out, (size_t)(T * H));
    CHECK_OK(og_moe_ref(&a));
    size_t worst = 0;
    double r = og_tol_ratio(out, want, (size_t)(T * H), 1e-4, 1e-4, &worst);
    CHECK_MSG(r <= 1, "%s%s ref: ratio %g at %zu (%g vs %g)", name, fused ? " fused" : "", r, worst, out[worst], want[worst]);
    og_threadpool *pool = og_threadpool_create(2);
    og_poison(out, (size_t)(T * H));
    CHECK_OK(og_moe_cpu(pool, &a));
    r = og_tol_ratio(out, want, (size_t)(T * H), 1e-4, 1e-4, &worst);
    CHECK_MSG(r <= 1, "%s%s cpu: ratio %g at %zu (%g vs %g)", name, fused ? " fused" : "", r, worst, out[worst], want[worst]);
    /* the shared expert matters here: without it the output moves */
    if (sh) {
        og_moe_args b = a;
        b.shared = NULL;
        b.shared_gate = NULL;
        CHECK_OK(og_moe_ref(&b));
        CHECK_MSG(og_tol_ratio(out, want, (size_t)(T * H), 1e-4, 1e-4, NULL) > 1, "%s: the shared expert changes nothing",
                  name);
    }
    og_threadpool_destroy(pool);
    free(x), free(want), free(router), free(gu), free(dn), free(lg), free(sh), free(sg), free(out);
    og_safetensors_close(st);
    cJSON_Delete(info);
    free(js);
}

static void check_ties(void) {
    og_test_section("ties: the set torch.topk picks on the GPU");
    char *js = og_test_read_file(OG_TEST_DATA_DIR "/moe/topk_ties.json");
    cJSON *root = js ? cJSON_Parse(js) : NULL;
    CHECK_MSG(root != NULL, "topk_ties.json missing");
    if (!root) return;
    const cJSON *c;
    int n = 0, cpu_same = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const cJSON *lj = cJSON_GetObjectItem(c, "logits"), *gpu = cJSON_GetObjectItem(c, "indices_cuda"),
                    *cpu = cJSON_GetObjectItem(c, "indices_cpu");
        const int32_t k = cJSON_GetObjectItem(c, "k")->valueint;
        const int E = cJSON_GetArraySize(lj);
        float *lg = malloc(sizeof(float) * (size_t)E), w[64];
        int32_t ex[64];
        for (int e = 0; e < E; e++) lg[e] = (float)cJSON_GetArrayItem(lj, e)->valuedouble;
        CHECK_OK(og_moe_route_ref(lg, 1, E, k, true, ex, w));
        /* as sets: the order among equal p does not change the output */
        bool same_gpu = gpu != NULL, same_cpu = true;
        for (int32_t j = 0; j < k; j++) {
            bool in_gpu = false, in_cpu = false;
            for (int32_t q = 0; q < k; q++) {
                if (gpu && cJSON_GetArrayItem(gpu, q)->valueint == ex[j]) in_gpu = true;
                if (cJSON_GetArrayItem(cpu, q)->valueint == ex[j]) in_cpu = true;
            }
            same_gpu = same_gpu && in_gpu;
            same_cpu = same_cpu && in_cpu;
        }
        CHECK_MSG(same_gpu, "case %d (E %d, k %d): not the experts torch.topk picks on the GPU", n, E, k);
        cpu_same += same_cpu;
        n++;
        free(lg);
    }
    printf("ties: %d cases, the GPU's set in all; torch on the CPU picks the same set in %d\n", n, cpu_same);
    cJSON_Delete(root);
    free(js);
}

int main(void) {
    og_test_section("Qwen3.5-MoE and Qwen3-Next sparse blocks against transformers");
    check_block("qwen35-moe-block", false);
    check_block("qwen35-moe-block", true);
    check_block("qwen3next-block", false);
    check_block("qwen3next-block", true);
    check_ties();
    return og_test_finish();
}
