#!/usr/bin/env bash
# offgraph chat driven through a pipe for three turns on every test
# checkpoint with a tokenizer: every turn renders the whole conversation and
# turns 2 and 3 prefill only what the session does not hold (fewer tokens
# than it already holds; it keeps reused_tokens of them, forking back where
# the new text's tokens differ, and grows by exactly the new tokens and the
# reply); /reset starts over; a ChatML model is recognised, one without a
# template gets a warning; published Jinja templates (Qwen3 with
# enable_thinking, Gemma) drive a chat, and a template's refusal
# (raise_exception) is reported without ending the chat; end of input ends
# cleanly.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
HF=$SRC/tests/data/hf
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

for name in llama-gqa mistral-sw qwen2-bias qwen3-mixed; do
    prog=$WORK/$name.ogp
    "$BIN" export "$HF/$name" -o "$prog" 2>/dev/null || { fail "$name: export"; continue; }
    # a long first turn, then short ones: a turn that re-prefilled the
    # conversation would take more tokens than the session already holds.
    # No /quit at the end: end of input must end the chat cleanly.
    printf '%s\n/stats\nWhy?\n/stats\nThanks\n/stats\n/reset\nAgain\n/stats\n' \
        "The cache lives beside the model, not inside it; each conversation keeps its own rows." |
        "$BIN" chat -m "$prog" -n 6 --seed 7 >"$WORK/$name.out" 2>"$WORK/$name.err" ||
        fail "$name: chat exit status: $(cat "$WORK/$name.err")"
    python3 - "$WORK/$name.out" <<'PY' || fail "$name: per-turn stats"
import json, sys
stats = []
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    if line.startswith('{"turn"'):
        stats.append(json.loads(line))
assert len(stats) == 4, stats
t1, t2, t3, again = stats
assert [t["turn"] for t in stats] == [1, 2, 3, 1], stats
assert t1["session_length"] == t1["prefill_tokens"] + t1["generated_tokens"], t1
for prev, cur in ((t1, t2), (t2, t3)):
    # only what is new is prefilled: fewer tokens than the session already
    # holds; it keeps a prefix of what it held (all of it unless the reply's
    # text reads back as other tokens) and grows by the new tokens and reply
    assert 0 < cur["prefill_tokens"] < prev["session_length"], (prev, cur)
    assert prev["session_length"] // 2 < cur["reused_tokens"] <= prev["session_length"], (prev, cur)
    assert cur["session_length"] == cur["reused_tokens"] + cur["prefill_tokens"] + cur["generated_tokens"], (prev, cur)
assert again["session_length"] == again["prefill_tokens"] + again["generated_tokens"], again
assert 0 < t3["kv_bytes_live"] <= t3["kv_bytes_allocated"], t3
PY
done
grep -q "warning" "$WORK/qwen2-bias.err" && fail "qwen2-bias (ChatML) got a warning: $(cat "$WORK/qwen2-bias.err")"
grep -q "warning: the model has no chat template" "$WORK/mistral-sw.err" ||
    fail "mistral-sw (no template) got no warning: $(cat "$WORK/mistral-sw.err")"

# /save writes the conversation's text beside the session file; /load in a
# new process goes on from it: the next turn replies as the conversation that
# never stopped (greedy), feeding the same tokens. Without the text (or with
# text that does not match the session), the loaded tokens are an opaque
# prefix and the chat says so.
prog=$WORK/qwen3-mixed.ogp
if [ -f "$prog" ]; then
    chat() { "$BIN" chat -m "$prog" -n 8 --temp 0 "$@"; }
    printf 'Hello there, how is the cache?\nWhy?\n/stats\n' | chat >"$WORK/whole.out" 2>"$WORK/whole.err" ||
        fail "save/load: the whole conversation: $(cat "$WORK/whole.err")"
    printf 'Hello there, how is the cache?\n/save %s\n' "$WORK/conv.ogs" | chat >/dev/null 2>"$WORK/save.err" ||
        fail "save/load: /save: $(cat "$WORK/save.err")"
    [ -s "$WORK/conv.ogs.chat.json" ] || fail "save/load: no conversation text beside the session file"
    printf '/load %s\nWhy?\n/stats\n' "$WORK/conv.ogs" | chat >"$WORK/loaded.out" 2>"$WORK/loaded.err" ||
        fail "save/load: /load: $(cat "$WORK/loaded.err")"
    python3 - "$WORK/whole.out" "$WORK/loaded.out" <<'PY' || fail "save/load: the loaded conversation's next turn differs"
import json, sys
def turns(path):
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    stats = [json.loads(l) for l in lines if l.startswith('{"turn"')]
    replies = [l for l in lines if not l.startswith('{"turn"')]
    return replies, stats[-1]
(whole_replies, w), (loaded_replies, l) = turns(sys.argv[1]), turns(sys.argv[2])
assert loaded_replies[-1] == whole_replies[-1], (whole_replies, loaded_replies)
for k in ("turn", "prefill_tokens", "generated_tokens", "session_length", "reused_tokens"):
    assert w[k] == l[k], (k, w, l)
assert l["turn"] == 2 and 0 < l["prefill_tokens"] < l["reused_tokens"], l
PY
    grep -q "no conversation text" "$WORK/loaded.err" && fail "save/load: the text was not read: $(cat "$WORK/loaded.err")"
    # text that does not match the session's length: refused, tokens kept as they are
    python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["held"].append(1); json.dump(d, open(p, "w"))' \
        "$WORK/conv.ogs.chat.json"
    printf '/load %s\nWhy?\n' "$WORK/conv.ogs" | chat >/dev/null 2>"$WORK/opaque.err" ||
        fail "save/load: /load without matching text: $(cat "$WORK/opaque.err")"
    grep -q "no conversation text beside" "$WORK/opaque.err" ||
        fail "save/load: mismatched text was taken: $(cat "$WORK/opaque.err")"
fi

# published templates, rendered as written: Qwen3 (thinking off through
# --chat-flag) and Gemma on the qwen3-mixed checkpoint
for tpl in qwen3 gemma; do
    mkdir -p "$WORK/$tpl-src"
    cp "$HF/qwen3-mixed/"* "$WORK/$tpl-src/"
    cp "$SRC/tests/data/chat_templates/$tpl.jinja" "$WORK/$tpl-src/chat_template.jinja"
    "$BIN" export "$WORK/$tpl-src" -o "$WORK/$tpl.ogp" 2>/dev/null || { fail "$tpl: export"; continue; }
done
printf 'Hello\n/stats\nWhy?\n/stats\nThanks\n/stats\n' |
    "$BIN" chat -m "$WORK/qwen3.ogp" -n 6 --seed 3 --chat-flag enable_thinking=false --system "Be brief." \
    >"$WORK/qwen3.out" 2>"$WORK/qwen3.err" || fail "qwen3 template: exit status: $(cat "$WORK/qwen3.err")"
python3 - "$WORK/qwen3.out" <<'PY' || fail "qwen3 template: per-turn stats"
import json, sys
stats = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8", errors="replace") if l.startswith('{"turn"')]
assert [t["turn"] for t in stats] == [1, 2, 3], stats
for prev, cur in zip(stats, stats[1:]):
    # thinking off: the template opened the last reply with an empty think
    # block, and drops it from earlier replies, so the session is forked back
    # to before it (into the previous prompt, not just the reply)
    assert 0 < cur["reused_tokens"] < prev["session_length"] - prev["generated_tokens"], (prev, cur)
    assert cur["session_length"] == cur["reused_tokens"] + cur["prefill_tokens"] + cur["generated_tokens"], (prev, cur)
PY
grep -q "warning" "$WORK/qwen3.err" && fail "qwen3 template got a warning: $(cat "$WORK/qwen3.err")"
"$BIN" chat -m "$WORK/qwen3.ogp" --chat-flag enable_thinking </dev/null >/dev/null 2>&1 && fail "--chat-flag without a value accepted"
# Gemma's template refuses a system message: the turn is refused with the
# template's message, and the chat goes on after /system without one
printf 'Hello\n/stats\n/system\nHello\n/stats\n' |
    "$BIN" chat -m "$WORK/gemma.ogp" -n 4 --seed 3 --system "Be brief." >"$WORK/gemma.out" 2>"$WORK/gemma.err" ||
    fail "gemma template: exit status: $(cat "$WORK/gemma.err")"
grep -q "raise_exception: System role not supported" "$WORK/gemma.err" ||
    fail "gemma template: no refusal: $(cat "$WORK/gemma.err")"
python3 - "$WORK/gemma.out" <<'PY' || fail "gemma template: stats"
import json, sys
stats = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8", errors="replace") if l.startswith('{"turn"')]
assert [t["turn"] for t in stats] == [0, 1], stats
assert stats[1]["prefill_tokens"] > 0, stats
PY

# /quit ends before later input is read
printf 'Hi\n/quit\nnot read\n/stats\n' | "$BIN" chat -m "$WORK/qwen2-bias.ogp" -n 3 >"$WORK/quit.out" 2>&1 ||
    fail "/quit exit status"
grep -q '"turn"' "$WORK/quit.out" && fail "input after /quit was read"

[ $fails -eq 0 ] && echo "cli_chat: all passed"
exit $((fails > 0))
