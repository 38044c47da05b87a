#!/usr/bin/env bash
# offgraph export of GGUF files (tests/data/gguf/, made by
# tests/fixtures/make_gguf_fixtures.py): the program is valid, has the
# layers of its model and an embedded tokenizer, and greedy text from it is
# the text from the same model exported from its Hugging Face checkpoint;
# broken and unsupported GGUF files fail naming the problem, leaving nothing.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
GG=$SRC/tests/data/gguf
HF=$SRC/tests/data/hf
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

declare -A LAYERS=([llama-gqa-f32]=2 [llama-gqa-q8_0]=2 [qwen2-bias-f16]=2 [qwen3-mixed-bf16]=4)
declare -A RINGS=([llama-gqa-f32]=0 [llama-gqa-q8_0]=0 [qwen2-bias-f16]=0 [qwen3-mixed-bf16]=2)
declare -A DTYPE=([llama-gqa-f32]=f32 [llama-gqa-q8_0]="q8 (norms bf16)" [qwen2-bias-f16]=f32 [qwen3-mixed-bf16]=bf16)
for name in llama-gqa-f32 llama-gqa-q8_0 qwen2-bias-f16 qwen3-mixed-bf16; do
    out=$WORK/$name.ogp
    if ! "$BIN" export "$GG/$name.gguf" -o "$out" 2>"$WORK/$name.err"; then
        fail "$name: export failed: $(cat "$WORK/$name.err")"
        continue
    fi
    grep -q "^exported .* $((LAYERS[$name])) layers ($((RINGS[$name])) ring), .* MB of ${DTYPE[$name]} weights, .*tokenizer embedded" \
        "$WORK/$name.err" || fail "$name: summary line: $(cat "$WORK/$name.err")"
    "$BIN" inspect "$out" >"$WORK/$name.txt" || fail "$name: inspect exit status"
    grep -q '^valid: yes$' "$WORK/$name.txt" || fail "$name: inspect does not say valid"
    grep -q '^tokenizer: embedded' "$WORK/$name.txt" || fail "$name: tokenizer not embedded"
done

# greedy text: the GGUF export and the Hugging Face export agree
for pair in llama-gqa-f32:llama-gqa qwen3-mixed-bf16:qwen3-mixed; do
    g=${pair%%:*} h=${pair##*:}
    "$BIN" export "$HF/$h" -o "$WORK/$h.hf.ogp" --dtype "${DTYPE[$g]}" 2>/dev/null || fail "$h: HF export"
    a=$("$BIN" run -m "$WORK/$g.ogp" -p "The cache lives" -n 16 --temp 0 2>/dev/null)
    b=$("$BIN" run -m "$WORK/$h.hf.ogp" -p "The cache lives" -n 16 --temp 0 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$g: greedy text \"$a\" differs from the HF export's \"$b\""
done

expect_fail() { # what message-needle args...
    local what=$1 needle=$2
    shift 2
    if "$BIN" "$@" >"$WORK/out.txt" 2>"$WORK/err.txt"; then
        fail "$what: succeeded"
    elif ! grep -qF -- "$needle" "$WORK/err.txt"; then
        fail "$what: message \"$(cat "$WORK/err.txt")\" does not name \"$needle\""
    fi
    [ ! -e "$WORK/bad.ogp" ] || fail "$what: left an output file"
}
head -c 3000 "$GG/qwen2-bias-f16.gguf" >"$WORK/cut.gguf"
expect_fail "truncated" "cut.gguf: key \"tokenizer.ggml.tokens\": array of 448 string elements does not fit" export "$WORK/cut.gguf" -o "$WORK/bad.ogp"
python3 - "$GG/qwen2-bias-f16.gguf" "$WORK/arch.gguf" <<'PY' || fail "could not edit the GGUF"
import sys
b = open(sys.argv[1], "rb").read()
i = b.index(b"qwen2", b.index(b"general.architecture"))
open(sys.argv[2], "wb").write(b[:i] + b"gemma" + b[i + 5:])
PY
expect_fail "architecture" '"general.architecture" = "gemma": not supported (llama, qwen2, qwen3, qwen3moe, qwen3next)' \
    export "$WORK/arch.gguf" -o "$WORK/bad.ogp"
# a qwen3next file whose full_attention_interval (which llama.cpp reads the
# layer kinds from) contradicts its tensors: layer 2 has no ssm_a
python3 - "$GG/qwen3next-bf16.gguf" "$WORK/interval.gguf" <<'PY' || fail "could not edit the GGUF"
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
i = b.index(b"qwen3next.full_attention_interval") + len(b"qwen3next.full_attention_interval")
assert struct.unpack_from("<II", b, i) == (4, 3)  # type uint32, value 3
struct.pack_into("<I", b, i + 4, 4)
open(sys.argv[2], "wb").write(b)
PY
expect_fail "interval" 'layer 2 is full attention (it has no ssm_a), which qwen3next.full_attention_interval = 4 contradicts' \
    export "$WORK/interval.gguf" -o "$WORK/bad.ogp"
"$BIN" export --help | grep -q 'GGUF' || fail "export --help does not mention GGUF"
[ $fails -eq 0 ] && echo "cli_export_gguf: all checks passed"
exit $((fails > 0))
