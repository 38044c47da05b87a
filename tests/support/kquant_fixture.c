/* The k-quant fixture checkpoint (kquant_fixture.h). */
#include "kquant_fixture.h"

#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>

uint64_t og_test_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

bool og_test_write_kq_checkpoint(const char *dir) {
    enum { H = 256, F = 512, V = 256, HQ = 4, HKV = 2, D = 64, L = 2 };
    struct {
        char name[80];
        int64_t rows, cols; /* cols 0: a vector */
        int kind;           /* 0 embed, 1 matrix, 2 norm */
    } t[3 + 11 * L];
    int n = 0;
#define T(nm, r, c, k) (snprintf(t[n].name, sizeof t[n].name, "%s", nm), t[n].rows = r, t[n].cols = c, t[n++].kind = k)
    T("model.embed_tokens.weight", V, H, 0);
    for (int i = 0; i < L; i++) {
        char b[80];
        static const struct {
            const char *s;
            int64_t r, c;
            int k;
        } layer[] = {{"input_layernorm.weight", H, 0, 2},     {"self_attn.q_proj.weight", HQ * D, H, 1},
                     {"self_attn.k_proj.weight", HKV * D, H, 1}, {"self_attn.v_proj.weight", HKV * D, H, 1},
                     {"self_attn.o_proj.weight", H, HQ * D, 1}, {"self_attn.q_norm.weight", D, 0, 2},
                     {"self_attn.k_norm.weight", D, 0, 2},      {"post_attention_layernorm.weight", H, 0, 2},
                     {"mlp.gate_proj.weight", F, H, 1},         {"mlp.up_proj.weight", F, H, 1},
                     {"mlp.down_proj.weight", H, F, 1}};
        for (size_t k = 0; k < sizeof layer / sizeof layer[0]; k++) {
            snprintf(b, sizeof b, "model.layers.%d.%s", i, layer[k].s);
            T(b, layer[k].r, layer[k].c, layer[k].k);
        }
    }
    T("model.norm.weight", H, 0, 2);
    T("lm_head.weight", V, H, 1);
#undef T
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fprintf(f, "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": %d, "
               "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": "
               "%d, \"num_key_value_heads\": %d, \"head_dim\": %d, \"max_position_embeddings\": 4096, "
               "\"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"rope_theta\": 1000000.0, "
               "\"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\"}\n", V, H, F, L, HQ, HKV, D);
    fclose(f);
    /* safetensors: the header (padded to 8 with spaces), then the data */
    char *hdr = malloc(16384);
    size_t hn = (size_t)snprintf(hdr, 16384, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t bytes = (uint64_t)(t[i].rows * (t[i].cols ? t[i].cols : 1) * 2);
        if (t[i].cols)
            hn += (size_t)snprintf(hdr + hn, 16384 - hn, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],"
                                   "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t[i].name, (long long)t[i].rows,
                                   (long long)t[i].cols, (unsigned long long)off, (unsigned long long)(off + bytes));
        else
            hn += (size_t)snprintf(hdr + hn, 16384 - hn, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],"
                                   "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t[i].name, (long long)t[i].rows,
                                   (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    hn += (size_t)snprintf(hdr + hn, 16384 - hn, "}");
    while (hn % 8) hdr[hn++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) return free(hdr), false;
    uint8_t len[8];
    for (int k = 0; k < 8; k++) len[k] = (uint8_t)((uint64_t)hn >> (8 * k));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, hn, f);
    free(hdr);
    for (int i = 0; i < n; i++) {
        uint64_t s = (uint64_t)i + 1;
        const int64_t count = t[i].rows * (t[i].cols ? t[i].cols : 1);
        const float scale = t[i].kind == 0 ? 0.5f : t[i].kind == 1 ? 1.0f / 16 : 0.25f;
        for (int64_t k = 0; k < count; k++) {
            const int64_t u = (int64_t)(og_test_splitmix(&s) >> 40) - (1 << 23);
            float v = (float)u / (float)(1 << 23) * scale + (t[i].kind == 2 ? 1.0f : 0.0f);
            const og_bf16 b = og_bf16_from_f32(v);
            const uint8_t le[2] = {(uint8_t)(b & 0xff), (uint8_t)(b >> 8)};
            fwrite(le, 1, 2, f);
        }
    }
    return fclose(f) == 0;
}

