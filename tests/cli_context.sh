#!/usr/bin/env bash
# The context limit, end to end: run refuses a prompt that cannot fit before
# any step (naming its tokens, the limit and export --max-context); -n past
# the limit stops there with finish reason length and exit 0; chat's
# context policies (stop: the turn is refused with a message; drop: the
# oldest turns go and the rest is read again, the system prompt kept);
# export refuses a --max-context beyond max_position_embeddings (or what the
# rope scaling covers) unless --force-max-context.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
HF=$SRC/tests/data/hf
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T() { timeout 120 "$@"; }

# ---- export: max-context against the positions the model was trained for
# qwen2-bias: max_position_embeddings 256, no rope scaling
T "$BIN" export "$HF/qwen2-bias" -o "$WORK/q.ogp" --max-context 64 2>/dev/null || fail "export --max-context 64"
T "$BIN" export "$HF/qwen2-bias" -o "$WORK/long.ogp" --max-context 4096 2>"$WORK/long.err" &&
    fail "export --max-context 4096 past max_position_embeddings 256 succeeded"
grep -q "exceeds the 256 positions" "$WORK/long.err" && grep -q -- "--force-max-context" "$WORK/long.err" ||
    fail "export past the trained context: $(cat "$WORK/long.err")"
[ -e "$WORK/long.ogp" ] || [ -e "$WORK/long.ogp.tmp" ] && fail "a refused export left a file"
T "$BIN" export "$HF/qwen2-bias" -o "$WORK/long.ogp" --max-context 4096 --force-max-context 2>"$WORK/force.err" ||
    fail "export --force-max-context: $(cat "$WORK/force.err")"
grep -q "warning: max-context 4096" "$WORK/force.err" || fail "no warning when forced: $(cat "$WORK/force.err")"
# llama-gqa: max_position_embeddings 128, llama3 rope scaling factor 4 over 16 positions: 128 covered
T "$BIN" export "$HF/llama-gqa" -o "$WORK/l.ogp" --max-context 128 2>/dev/null || fail "llama-gqa at 128"
T "$BIN" export "$HF/llama-gqa" -o "$WORK/l2.ogp" --max-context 129 2>/dev/null && fail "llama-gqa at 129 succeeded"

# ---- run: a prompt that cannot fit is refused before any step
long=$(python3 -c 'print(" ".join(["cache"] * 200))')
T "$BIN" run -m "$WORK/q.ogp" -p "$long" -n 4 >"$WORK/long.out" 2>"$WORK/long.run.err"
[ $? -eq 1 ] || fail "too long a prompt: exit status not 1"
[ -s "$WORK/long.out" ] && fail "too long a prompt printed text: $(head -c 200 "$WORK/long.out")"
grep -Eq "the prompt is [0-9]+ tokens, more than the model's context limit of 64 tokens" "$WORK/long.run.err" &&
    grep -q -- "--max-context" "$WORK/long.run.err" || fail "too long a prompt: $(cat "$WORK/long.run.err")"

# ---- run: -n past the limit stops at it, finish reason length, exit 0
T "$BIN" run -m "$WORK/q.ogp" -p "The cache lives" -n 500 --temp 0 --stats --stop "never in this text" \
    >"$WORK/n.out" 2>"$WORK/n.err" || fail "-n past the limit: exit status: $(cat "$WORK/n.err")"
grep -q "stopped at the model's context limit (64 tokens)" "$WORK/n.err" || fail "-n past the limit: $(cat "$WORK/n.err")"
python3 - "$WORK/n.err" <<'PY' || fail "-n past the limit: stats"
import json, sys
s = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert s["finish_reason"] == "length", s
# every row of the session is used, and the last token drawn is printed too
assert s["prompt_tokens"] + s["generated_tokens"] == 64 + 1, s
PY
# a prompt of exactly the limit still gives one token
n64=$(python3 -c 'print(" ".join(["cache"] * 80))')
T "$BIN" run -m "$WORK/q.ogp" -p "$n64" -n 0 --stats >/dev/null 2>"$WORK/p.err"
pt=$(python3 -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["prompt_tokens"])' "$WORK/p.err" 2>/dev/null)
if [ -n "$pt" ] && [ "$pt" -le 64 ]; then
    T "$BIN" run -m "$WORK/q.ogp" -p "$n64" -n 9 --stats --temp 0 >/dev/null 2>"$WORK/p2.err" || fail "a full prompt: exit"
    grep -q '"finish_reason": "length"' "$WORK/p2.err" || fail "a full prompt: $(cat "$WORK/p2.err")"
fi

# ---- chat: policy stop refuses the turn that cannot fit, and goes on
msg="Tell me about the cache and the rows it keeps"
printf '%s\n' "$msg" "$msg" "$msg" "$msg" "$msg" "$msg" /stats |
    T "$BIN" chat -m "$WORK/q.ogp" -n 8 --temp 0 >"$WORK/stop.out" 2>"$WORK/stop.err" ||
    fail "chat stop policy: exit status: $(cat "$WORK/stop.err")"
grep -q "the conversation is full" "$WORK/stop.err" || fail "chat stop policy: no message: $(cat "$WORK/stop.err")"
python3 - "$WORK/stop.out" <<'PY' || fail "chat stop policy: stats"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1], errors="replace") if l.startswith('{"turn"')][-1]
assert 0 < s["session_length"] <= 64 and s["context_limit"] == 64, s
assert s["turn"] < 6, s
PY
# ---- chat: policy drop answers every turn, within the limit, system prompt kept
printf '%s\n/stats\n' "$msg" "$msg" "$msg" "$msg" "$msg" "$msg" |
    T "$BIN" chat -m "$WORK/q.ogp" -n 8 --temp 0 --context-policy drop --system "Be brief." \
        >"$WORK/drop.out" 2>"$WORK/drop.err" || fail "chat drop policy: exit status: $(cat "$WORK/drop.err")"
grep -q "forgot the [0-9]* oldest turn.*(the system prompt kept)" "$WORK/drop.err" ||
    fail "chat drop policy: no message: $(cat "$WORK/drop.err")"
python3 - "$WORK/drop.out" <<'PY' || fail "chat drop policy: stats"
import json, sys
st = [json.loads(l) for l in open(sys.argv[1], errors="replace") if l.startswith('{"turn"')]
assert [s["turn"] for s in st] == [1, 2, 3, 4, 5, 6], st
assert all(0 < s["session_length"] <= 64 for s in st), st
PY
T "$BIN" chat -m "$WORK/q.ogp" --context-policy keep </dev/null >/dev/null 2>&1 && fail "--context-policy keep accepted"

[ $fails -eq 0 ] && echo "cli_context: all passed"
exit $((fails > 0))
