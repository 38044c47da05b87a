#!/usr/bin/env bash
# offgraph export / inspect on every test checkpoint: exports are valid,
# runtime (KV) tensors carry no bytes, the file size does not depend on
# --max-context, and bad inputs fail naming the problem with no file left.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
HF=$SRC/tests/data/hf
SYN=$SRC/tests/data/hf-synthetic
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# layers and ring layers each checkpoint must show
declare -A LAYERS=([llama-gqa]=2 [qwen3-mixed]=4 [qwen2-bias]=2 [mistral-sw]=2 [llama-v4-sharded]=2)
declare -A RINGS=([llama-gqa]=0 [qwen3-mixed]=2 [qwen2-bias]=0 [mistral-sw]=2 [llama-v4-sharded]=0)

for name in llama-gqa qwen3-mixed qwen2-bias mistral-sw llama-v4-sharded; do
    dir=$HF/$name
    [ -d "$dir" ] || dir=$SYN/$name
    out=$WORK/$name.ogp
    if ! "$BIN" export "$dir" -o "$out" 2>"$WORK/$name.err"; then
        fail "$name: export failed: $(cat "$WORK/$name.err")"
        continue
    fi
    grep -q "^exported .* $((LAYERS[$name])) layers ($((RINGS[$name])) ring)" "$WORK/$name.err" ||
        fail "$name: summary line: $(cat "$WORK/$name.err")"
    "$BIN" inspect "$out" >"$WORK/$name.txt" || fail "$name: inspect exit status"
    grep -q '^valid: yes$' "$WORK/$name.txt" || fail "$name: inspect does not say valid"
    runtime=$(grep -c '^  kv\.[0-9]*\.[kv] ' "$WORK/$name.txt")
    stored0=$(grep '^  kv\.[0-9]*\.[kv] ' "$WORK/$name.txt" | grep -c ' 0 bytes stored$')
    [ "$runtime" -eq $((2 * LAYERS[$name])) ] || fail "$name: $runtime runtime tensors, want $((2 * LAYERS[$name]))"
    [ "$stored0" -eq "$runtime" ] || fail "$name: runtime tensors with stored bytes"
    rings=$(grep -c '^  layer .* ring ' "$WORK/$name.txt")
    [ "$rings" -eq "${RINGS[$name]}" ] || fail "$name: $rings ring layers in the manifest, want ${RINGS[$name]}"
    if [ -f "$dir/tokenizer.json" ]; then
        grep -q '^tokenizer: embedded' "$WORK/$name.txt" || fail "$name: tokenizer not embedded"
    else
        grep -q '^tokenizer: absent' "$WORK/$name.txt" || fail "$name: tokenizer should be absent"
    fi
    "$BIN" inspect --json "$out" | grep -q '"valid":	true' || fail "$name: inspect --json"
    # the KV storage is declared, never stored: same size at 128 and 32768 tokens
    for ctx in 128 32768; do
        "$BIN" export "$dir" -o "$WORK/$name.$ctx.ogp" --max-context $ctx --initial-capacity 64 --max-write 64 \
            --force-max-context 2>/dev/null || fail "$name: export --max-context $ctx"
    done
    s1=$(stat -c %s "$WORK/$name.128.ogp" 2>/dev/null || echo 0)
    s2=$(stat -c %s "$WORK/$name.32768.ogp" 2>/dev/null || echo 1)
    # equal up to the manifest's longer numbers and its payload alignment (64 B);
    # the KV rows of 32768 tokens would add megabytes
    d=$((s2 - s1)); d=${d#-}
    [ "$d" -le 64 ] || fail "$name: file size depends on max-context ($s1 vs $s2)"
    grep -q 'max_capacity 32768' <("$BIN" inspect "$WORK/$name.32768.ogp") || fail "$name: max_capacity 32768 not declared"
done

# the synthetic float16 checkpoint becomes f32 by default, bf16 on request
grep -q 'activations f32' "$WORK/llama-v4-sharded.txt" || fail "f16 checkpoint: default dtype is not f32"
"$BIN" export "$SYN/llama-v4-sharded" -o "$WORK/v4bf16.ogp" --dtype bf16 --kv-dtype f32 2>/dev/null &&
    "$BIN" inspect "$WORK/v4bf16.ogp" | grep -q 'weights: 21 tensors, 21664 parameters, 43328 bytes' ||
    fail "--dtype bf16: weights are not 2 bytes each"
"$BIN" inspect "$WORK/v4bf16.ogp" | grep -q 'kv_dtype f32' || fail "--kv-dtype f32 not declared"

# --weights q8 / q4: every matrix quantized (the fixture's rows are whole
# groups of 32), norms in the dtype; bytes as docs/program-format.md sizes
# them; --kv-dtype int8 / fp8 declared; the programs run
for w in q8 q4; do
    "$BIN" export "$HF/qwen3-mixed" -o "$WORK/q.$w.ogp" --weights $w --kv-dtype int8 2>"$WORK/q.$w.err" ||
        fail "--weights $w: $(cat "$WORK/q.$w.err")"
    grep -q "MB of $w (norms " "$WORK/q.$w.err" || fail "--weights $w: summary line: $(cat "$WORK/q.$w.err")"
    "$BIN" inspect "$WORK/q.$w.ogp" --json >"$WORK/q.$w.json" || fail "--weights $w: inspect"
    python3 - "$WORK/q.$w.json" $w <<'PY' || fail "--weights $w: tensors"
import json, sys
j, w = json.load(open(sys.argv[1])), sys.argv[2]
bad = []
for t in j["runtime_tensors"]:
    if t["dtype"] != "int8": bad.append("%s is %s, not int8" % (t["name"], t["dtype"]))
for t in j["weights"]:
    want = w if len(t["shape"]) == 2 else j["model"]["activation_dtype"]
    if t["name"].endswith(".bias"): want = "f32"
    if t["dtype"] != want: bad.append("%s is %s, not %s" % (t["name"], t["dtype"], want))
    if t["dtype"] in ("q8", "q4"):
        n, k = t["shape"]
        size = n * k * (1 if w == "q8" else 0.5) + n * k // 32 * 2
        if t.get("nbytes") != size: bad.append("%s: nbytes %s, want %d" % (t["name"], t.get("nbytes"), size))
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
    "$BIN" eval -m "$WORK/q.$w.ogp" --tokens 1,2,3,4,5 --backend cpu --logits-out "$WORK/q.$w.f32" >/dev/null 2>"$WORK/q.$w.eval" ||
        fail "--weights $w: eval: $(cat "$WORK/q.$w.eval")"
done

# a window as long as the whole context is declared flat
"$BIN" export "$HF/mistral-sw" -o "$WORK/mw.ogp" --max-context 6 2>/dev/null &&
    [ "$("$BIN" inspect "$WORK/mw.ogp" | grep -c '^  layer .* flat ')" -eq 2 ] ||
    fail "mistral-sw at max-context 6: layers should be flat"

# bad inputs: non-zero exit, the expected message, no output, no .tmp
expect_fail() { # label, expected message, args...
    local label=$1 want=$2
    shift 2
    rm -f "$WORK/bad.ogp" "$WORK/bad.ogp.tmp"
    if "$BIN" "$@" >"$WORK/bad.out" 2>"$WORK/bad.err"; then
        fail "$label: succeeded"
    fi
    grep -qF -- "$want" "$WORK/bad.err" || fail "$label: message lacks '$want': $(cat "$WORK/bad.err")"
    [ ! -e "$WORK/bad.ogp" ] && [ ! -e "$WORK/bad.ogp.tmp" ] || fail "$label: left a file behind"
}
expect_fail "model_type" 'field "model_type" = "gpt2"' export "$SYN/bad-model-type" -o "$WORK/bad.ogp"
expect_fail "rope type" 'field "rope_scaling.rope_type" = "yarn"' export "$SYN/bad-rope-type" -o "$WORK/bad.ogp"
expect_fail "tensor dtype" 'tensor "model.embed_tokens.weight": dtype "I8" is not supported' \
    export "$SYN/bad-tensor-dtype" -o "$WORK/bad.ogp"
expect_fail "no folder" "$WORK/none/config.json: cannot open" export "$WORK/none" -o "$WORK/bad.ogp"
expect_fail "no -o" "no output file (-o) given" export "$HF/llama-gqa"
expect_fail "max-write" "max-write 300 exceeds max-context 256" export "$HF/qwen2-bias" -o "$WORK/bad.ogp" --max-write 300
expect_fail "bad number" '--max-context needs an integer' export "$HF/qwen2-bias" -o "$WORK/bad.ogp" --max-context 12x
expect_fail "bad dtype" '--dtype must be bf16 or f32, got "f16"' export "$HF/qwen2-bias" -o "$WORK/bad.ogp" --dtype f16
mkdir -p "$WORK/edited" && cp "$HF/llama-gqa"/* "$WORK/edited/"
sed -i 's/"intermediate_size": 96/"intermediate_size": 97/' "$WORK/edited/config.json"
expect_fail "shape" 'tensor "model.layers.0.mlp.gate_proj.weight" has shape [96, 64], config.json implies [97, 64]' \
    export "$WORK/edited" -o "$WORK/bad.ogp"
cp "$HF/llama-gqa/config.json" "$WORK/edited/config.json"
python3 - "$WORK/edited/model.safetensors" <<'PY' || fail "could not edit the checkpoint"
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
del h["lm_head.weight"]
t = json.dumps(h).encode()
open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
expect_fail "missing tensor" 'tensor "lm_head.weight" is missing' export "$WORK/edited" -o "$WORK/bad.ogp"
expect_fail "no output folder" "$WORK/nodir/x.ogp" export "$HF/llama-gqa" -o "$WORK/nodir/x.ogp"
[ ! -e "$WORK/nodir" ] || fail "an output folder was created"

# inspect refuses a damaged file naming a rule
head -c 2000 "$WORK/llama-gqa.ogp" >"$WORK/cut.ogp"
"$BIN" inspect "$WORK/cut.ogp" >"$WORK/cut.txt" && fail "inspect accepted a truncated file"
grep -q '^valid: no (rule [a-z_]*)' "$WORK/cut.txt" || fail "inspect: $(cat "$WORK/cut.txt")"

"$BIN" export --help | grep -q -- '--max-context' || fail "export --help"
[ $fails -eq 0 ] && echo "cli_export: all checks passed"
exit $((fails > 0))
