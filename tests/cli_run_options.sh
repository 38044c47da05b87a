#!/usr/bin/env bash
# offgraph run's prompt and output options: -f <file> and -p - (stdin) give
# the same run as -p <text>; --stop strings end the text before them (never
# printed, matched across tokens); --stats is one line of JSON on stderr and
# nothing of it on stdout; BOS is added where the tokenizer's post-processor
# (TemplateProcessing) says, whatever tokenizer_config.json's add_bos_token
# says (as transformers 5), on a SentencePiece-style (Metaspace, byte
# fallback) tokenizer, and not with --no-special.
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

# ---- -f and -p - on the demo model (no -m)
prompt="In the beginning"
T "$BIN" run -p "$prompt" -n 24 --temp 0 >"$WORK/p.out" 2>"$WORK/p.err" || fail "run -p: $(cat "$WORK/p.err")"
printf '%s' "$prompt" >"$WORK/prompt.txt"
T "$BIN" run -f "$WORK/prompt.txt" -n 24 --temp 0 >"$WORK/f.out" 2>/dev/null || fail "run -f"
cmp -s "$WORK/p.out" "$WORK/f.out" || fail "-f differs from -p: $(cat "$WORK/f.out")"
printf '%s' "$prompt" | T "$BIN" run -p - -n 24 --temp 0 >"$WORK/s.out" 2>/dev/null || fail "run -p -"
cmp -s "$WORK/p.out" "$WORK/s.out" || fail "-p - differs from -p: $(cat "$WORK/s.out")"
T "$BIN" run -f "$WORK/missing.txt" >/dev/null 2>"$WORK/m.err" && fail "-f of a missing file succeeded"
grep -q "cannot open" "$WORK/m.err" || fail "-f missing: $(cat "$WORK/m.err")"
T "$BIN" run -p x -f "$WORK/prompt.txt" >/dev/null 2>&1 && fail "-p and -f together accepted"

# ---- --stop: the text ends just before the first occurrence, which is never printed
python3 - "$WORK/p.out" "$prompt" >"$WORK/stop.arg" <<'PY' || fail "no stop string to pick from: $(cat "$WORK/p.out")"
import sys
text = open(sys.argv[1], encoding="utf-8").read()[len(sys.argv[2]):].rstrip("\n")
words = text.split()
assert len(words) >= 4, text
print(" ".join(words[2:4])) # two words: across token boundaries
PY
stop=$(cat "$WORK/stop.arg")
T "$BIN" run -p "$prompt" -n 24 --temp 0 --stop "zzz-not-there" --stop "$stop" --stats >"$WORK/stop.out" 2>"$WORK/stop.err" ||
    fail "--stop: exit status"
python3 - "$WORK/p.out" "$WORK/stop.out" "$stop" <<'PY' || fail "--stop \"$stop\": $(cat "$WORK/stop.out")"
import sys
full, cut, stop = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
want = full[:full.index(stop)] + "\n"
assert cut == want, (cut, want)
PY
grep -q '"finish_reason": "stop"' "$WORK/stop.err" || fail "--stop: finish reason: $(cat "$WORK/stop.err")"

# ---- --stats: stderr only, one JSON line
grep -q '"prompt_tokens"' "$WORK/stop.out" && fail "--stats on stdout"
python3 -c 'import json,sys; s=json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1]); assert s["generated_tokens"] > 0' \
    "$WORK/stop.err" || fail "--stats JSON on stderr: $(cat "$WORK/stop.err")"

# ---- BOS on a SentencePiece-style tokenizer (mistral-sw: Metaspace, byte fallback, <s> = 1)
tokens() { # prompt_tokens of a run: <folder> [options]
    local d=$1
    shift
    T "$BIN" run -m "$d.ogp" -p "The cache lives" -n 1 --temp 0 --stats "$@" 2>&1 >/dev/null |
        python3 -c 'import json,sys; print(json.loads([l for l in sys.stdin if l.startswith("{")][-1])["prompt_tokens"])'
}
variant() { # <name> <post_processor: template|none> <add_bos_token: true|false|absent>
    local d=$WORK/$1
    cp -r "$HF/mistral-sw" "$d"
    python3 - "$d" "$2" "$3" <<'PY'
import json, sys
d, pp, add = sys.argv[1:]
tok = json.load(open(d + "/tokenizer.json"))
if pp == "template":
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
json.dump(tok, open(d + "/tokenizer.json", "w"))
cfg = json.load(open(d + "/tokenizer_config.json"))
if add != "absent":
    cfg["add_bos_token"] = add == "true"
json.dump(cfg, open(d + "/tokenizer_config.json", "w"))
PY
    T "$BIN" export "$d" -o "$d.ogp" 2>/dev/null || fail "export $1"
}
variant plain none absent
variant tpl template absent
variant tpl-off template false
variant cfg-on none true
base=$(tokens "$WORK/plain")
[ -n "$base" ] && [ "$base" -gt 0 ] || fail "BOS: no token count ($base)"
[ "$(tokens "$WORK/tpl")" = $((base + 1)) ] || fail "BOS: TemplateProcessing <s> not added ($(tokens "$WORK/tpl") vs $base)"
[ "$(tokens "$WORK/tpl" --no-special)" = "$base" ] || fail "BOS: --no-special still adds it"
# tokenizer_config.json's add_bos_token changes nothing, as in transformers 5
# (tests/data/tokenizers/special_tokens.json): the post-processor decides
[ "$(tokens "$WORK/tpl-off")" = $((base + 1)) ] || fail "BOS: add_bos_token false removed the template's BOS"
[ "$(tokens "$WORK/cfg-on")" = "$base" ] || fail "BOS: add_bos_token true added one the post-processor does not"
# the Qwen-style fixtures (no special tokens in their template) add nothing
T "$BIN" export "$HF/qwen2-bias" -o "$WORK/q.ogp" 2>/dev/null
[ "$(tokens "$WORK/q")" = "$(tokens "$WORK/q" --no-special)" ] || fail "BOS added to a tokenizer without one"

# ---- --kv-dtype: int8 and fp8 sessions run (24 greedy tokens) and hold fewer
# KV bytes than bf16 (a byte an element and a 4-byte scale per head of D:
# (D + 4) / 2D of bf16's, padding aside); a weight format is refused by name
live() { sed -n 's/.*"kv_bytes_live": \([0-9]*\).*/\1/p' "$1"; }
for kv in bf16 int8 fp8; do
    T "$BIN" run -p "$prompt" -n 24 --temp 0 --kv-dtype $kv --stats >"$WORK/kv-$kv.out" 2>"$WORK/kv-$kv.err" ||
        fail "run --kv-dtype $kv: $(cat "$WORK/kv-$kv.err")"
    grep -q '"generated_tokens": 24' "$WORK/kv-$kv.err" || fail "run --kv-dtype $kv: stats $(cat "$WORK/kv-$kv.err")"
done
[ -n "$(live "$WORK/kv-int8.err")" ] && [ "$(live "$WORK/kv-int8.err")" = "$(live "$WORK/kv-fp8.err")" ] &&
    [ "$(live "$WORK/kv-int8.err")" -lt "$(live "$WORK/kv-bf16.err")" ] ||
    fail "kv bytes live: bf16 $(live "$WORK/kv-bf16.err"), int8 $(live "$WORK/kv-int8.err"), fp8 $(live "$WORK/kv-fp8.err")"
T "$BIN" run -p x --kv-dtype q8 >/dev/null 2>"$WORK/kv-q8.err" && fail "--kv-dtype q8 accepted"
grep -q 'expects bf16, f32, int8 or fp8, got "q8"' "$WORK/kv-q8.err" || fail "--kv-dtype q8: $(cat "$WORK/kv-q8.err")"

[ $fails -eq 0 ] && echo "cli_run_options: all passed"
exit $((fails > 0))
