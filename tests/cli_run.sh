#!/usr/bin/env bash
# offgraph run end to end on every test checkpoint that has a tokenizer: the
# text starts with the prompt, a seed repeats a run, --stats writes one
# line of JSON with every key and sane values to stderr (never to stdout); without -m it runs the demo
# model the build exported; on a program exported without a tokenizer, run
# says what is missing (eval still works).
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
    for i in 1 2; do
        "$BIN" run -m "$prog" -p "The cache lives" -n 12 --seed 42 --stats >"$WORK/$name.$i.out" 2>"$WORK/$name.$i.err" ||
            fail "$name: run exit status: $(cat "$WORK/$name.$i.err")"
    done
    # the text is the same, and holds no --stats line
    cmp -s "$WORK/$name.1.out" "$WORK/$name.2.out" || fail "$name: the same seed gave two different runs"
    grep -q prompt_tokens "$WORK/$name.1.out" && fail "$name: --stats went to stdout"
    "$BIN" run -m "$prog" -p "The cache lives" -n 12 --seed 43 >"$WORK/$name.3.out" 2>/dev/null
    cmp -s "$WORK/$name.1.out" "$WORK/$name.3.out" && fail "$name: another seed, the same run"
    head -c 15 "$WORK/$name.1.out" | grep -q "^The cache lives" || fail "$name: output does not start with the prompt"
    python3 - "$WORK/$name.1.err" <<'PY' || fail "$name: --stats line"
import json, sys
lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
s = json.loads(lines[-1])
keys = ["prompt_tokens", "generated_tokens", "prefill_tokens_per_s", "decode_tokens_per_s",
        "kv_bytes_allocated", "kv_bytes_live", "growth_events", "context_limit", "finish_reason"]
assert sorted(s) == sorted(keys), s
assert s["prompt_tokens"] >= 3 and 0 <= s["generated_tokens"] <= 12, s
assert s["prefill_tokens_per_s"] > 0 and s["growth_events"] >= 0, s
assert s["finish_reason"] in ("stop", "length") and s["context_limit"] > 0, s
assert 0 < s["kv_bytes_live"] <= s["kv_bytes_allocated"], s
PY
    # greedy is repeatable without a seed
    a=$("$BIN" run -m "$prog" -p "Hello, world" -n 8 --temp 0 2>&1)
    b=$("$BIN" run -m "$prog" -p "Hello, world" -n 8 --temp 0 2>&1)
    [ "$a" = "$b" ] || fail "$name: greedy runs differ"
done

# no -m: the demo model the build exported
out=$("$BIN" run -p "In the beginning" -n 8 --temp 0 2>"$WORK/nom.err") || fail "run without -m: $(cat "$WORK/nom.err")"
case "$out" in "In the beginning"?*) ;; *) fail "run without -m printed: $out" ;; esac

# a program without a tokenizer: eval works, run and chat say what is missing
mkdir -p "$WORK/notok"
for f in "$HF/llama-gqa"/*; do
    case $(basename "$f") in tokenizer*) ;; *) cp "$f" "$WORK/notok/" ;; esac
done
"$BIN" export "$WORK/notok" -o "$WORK/notok.ogp" 2>/dev/null || fail "export without tokenizer"
"$BIN" eval -m "$WORK/notok.ogp" --tokens 5,6,7 --logits-out "$WORK/notok.f32" 2>/dev/null ||
    fail "eval on a program without a tokenizer"
"$BIN" run -m "$WORK/notok.ogp" -p hi >/dev/null 2>"$WORK/notok.run.err" && fail "run without tokenizer succeeded"
grep -q "has no tokenizer" "$WORK/notok.run.err" || fail "run without tokenizer: $(cat "$WORK/notok.run.err")"
echo hi | "$BIN" chat -m "$WORK/notok.ogp" >/dev/null 2>"$WORK/notok.chat.err" && fail "chat without tokenizer succeeded"
grep -q "has no tokenizer" "$WORK/notok.chat.err" || fail "chat without tokenizer: $(cat "$WORK/notok.chat.err")"

[ $fails -eq 0 ] && echo "cli_run: all passed"
exit $((fails > 0))
