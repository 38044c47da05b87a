#!/usr/bin/env bash
# offgraph chat driven through a pipe for three turns on every test
# checkpoint with a tokenizer: turns 2 and 3 prefill only their own tokens
# (fewer than the session already holds, and the session grows by exactly
# the new turn and its reply); /reset starts over; a ChatML model is
# recognised, one without a template gets a warning; end of input ends
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
    # only the new turn is prefilled: fewer tokens than the session already
    # holds, and the session grows by exactly that turn and its reply
    assert 0 < cur["prefill_tokens"] < prev["session_length"], (prev, cur)
    assert cur["session_length"] == prev["session_length"] + cur["prefill_tokens"] + cur["generated_tokens"], (prev, cur)
assert again["session_length"] == again["prefill_tokens"] + again["generated_tokens"], again
assert 0 < t3["kv_bytes_live"] <= t3["kv_bytes_allocated"], t3
PY
done
grep -q "warning" "$WORK/qwen2-bias.err" && fail "qwen2-bias (ChatML) got a warning: $(cat "$WORK/qwen2-bias.err")"
grep -q "warning: the model has no chat template" "$WORK/mistral-sw.err" ||
    fail "mistral-sw (no template) got no warning: $(cat "$WORK/mistral-sw.err")"

# /quit ends before later input is read
printf 'Hi\n/quit\nnot read\n/stats\n' | "$BIN" chat -m "$WORK/qwen2-bias.ogp" -n 3 >"$WORK/quit.out" 2>&1 ||
    fail "/quit exit status"
grep -q '"turn"' "$WORK/quit.out" && fail "input after /quit was read"

[ $fails -eq 0 ] && echo "cli_chat: all passed"
exit $((fails > 0))
