/* Chat formats: recognised from real template texts (the qwen fixture's
 * chat_template.jinja, and the Llama-3 and Mistral markers), and each turn
 * rendered as the family's template writes it (hand-written expectations). */
#include "harness.h"
#include "core/core.h"
#include "model/chat_template.h"

#include <stdlib.h>
#include <string.h>

static void expect_turn(og_chat_format f, int first, const char *user, const char *want) {
    char *got = NULL;
    CHECK_OK(og_chat_render_turn(f, first, user, &got));
    CHECK_MSG(got && !strcmp(got, want), "%s turn (first %d): got \"%s\", want \"%s\"", og_chat_format_name(f), first,
              got ? got : "(null)", want);
    og_free(got);
}

int main(void) {
    og_test_section("detect");
    char path[512];
    snprintf(path, sizeof path, "%s/hf/qwen2-bias/chat_template.jinja", OG_TEST_DATA_DIR);
    FILE *f = fopen(path, "rb");
    char tpl[4096] = {0};
    CHECK(f && fread(tpl, 1, sizeof tpl - 1, f) > 0);
    if (f) fclose(f);
    CHECK(og_chat_format_detect(tpl) == OG_CHAT_CHATML);
    CHECK(og_chat_format_detect("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                                "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}") == OG_CHAT_LLAMA3);
    CHECK(og_chat_format_detect("{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]"
                                "{% endfor %}") == OG_CHAT_MISTRAL);
    CHECK(og_chat_format_detect("{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}{% endfor %}") ==
          OG_CHAT_PLAIN);
    CHECK(og_chat_format_detect(NULL) == OG_CHAT_PLAIN);

    og_test_section("render");
    expect_turn(OG_CHAT_CHATML, 1, "hi", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    expect_turn(OG_CHAT_CHATML, 0, "more", "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n");
    expect_turn(OG_CHAT_LLAMA3, 1, "hi",
                "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_turn(OG_CHAT_LLAMA3, 0, "x",
                "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_turn(OG_CHAT_MISTRAL, 1, "hi", "<s>[INST] hi [/INST]");
    expect_turn(OG_CHAT_MISTRAL, 0, "again", "</s>[INST] again [/INST]");
    expect_turn(OG_CHAT_PLAIN, 1, "hi", "hi\n");
    expect_turn(OG_CHAT_PLAIN, 0, "100% %s", "\n100% %s\n"); /* user text is never a format */
    CHECK(!strcmp(og_chat_end_of_turn(OG_CHAT_CHATML), "<|im_end|>"));
    CHECK(og_chat_end_of_turn(OG_CHAT_PLAIN) == NULL);
    return og_test_finish();
}
