#!/usr/bin/env bash
# Tensor parallel on the CPU (src/exec/shard.c, src/exec/backend_cpu_tp.c):
# every fixture of tests/data/hf (dense, MoE and hybrid) is exported in f32
# and run with offgraph eval cut into N = 2, 3, 4 and 8 shards, whole and fed
# 1 and 5 tokens a step. Every run must give logits that match
#  - transformers' (the fixture's logits.f32, tests/fixtures/make_hf_fixtures.py)
#    within cli_parity.sh's f32 bound, 0.02, and
#  - the unsharded run's within the reduction-order bound below;
# and three of them with int8 / fp8 KV storage (each shard's heads of the
# quantized rows) against the unsharded run of that storage at N = 2, 4, 8.
# The fixtures have 3 to 8 query heads and 1 to 4 kv heads (Qwen2's are 6 and
# 3; the hybrids' 2 key and 4 value heads), so these N cut heads unevenly,
# share kv / key heads between shards and, at N = 8, share query and value
# heads (each shard then owns part of a head's columns).
#
# The bound. A sharded run computes what the unsharded one does except that a
# row-parallel product (o, down, a linear layer's out, the experts' down) sums
# its K terms as N partial sums added in shard order, and the embedding adds
# zeros. Any two summation orders of K f32 products lie within
# 2 gamma_K sum |x_k w_k| of each other (gamma_K = K u / (1 - K u), u = 2^-24;
# Higham, Accuracy and Stability of Numerical Algorithms, 3.1). Here K <= 128,
# so each such product may move by 2 x 7.6e-6 x sum |x w|, and sum |x w| is of
# the order of the product's output (random unit-gain weights). At most 17
# such products lie in series over the fixtures' 4 layers (o, down, and each
# expert's down, per layer; the head), each moving the logits (under 5,
# meta.json) by at most that share: 17 x 1.5e-5 x 5 ~ 1.3e-3; the bound is
# 2e-3 (measured at most 2.0e-5). A head, column or expert cut wrong moves logits by
# O(1).
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
CMP=$(dirname "$BIN")/tests/compare_logits
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
runs=0
ran_n=" "
# offgraph with the arguments after $2, its logits into $2; a failure is
# counted and told under the name $1.
eval_to() {
    local label=$1 out=$2
    shift 2
    "$BIN" "$@" --logits-out "$out" 2>"$WORK/eval.log" && return 0
    echo "FAIL $label: $(cat "$WORK/eval.log")"
    fails=$((fails + 1))
    return 1
}
# A sharded run's logits $2 against transformers' ($5, unless empty) within
# the f32 parity bound and against the unsharded run's ($3) within the
# reduction-order bound (or $6 where given); $1 names the run, $4 its rows.
against() {
    local ref res
    if [ -n "$5" ] && ! ref=$("$CMP" "$2" "$5" "$4" 0.02); then
        echo "FAIL $1 against transformers: $ref"
        fails=$((fails + 1))
    elif ! res=$("$CMP" "$2" "$3" "$4" "${6:-0.002}"); then
        echo "FAIL $1 against one shard: $res"
        fails=$((fails + 1))
    else
        echo "ok   $1: against one shard $res"
    fi
}
for dir in "$SRC"/tests/data/hf/*/; do
    name=$(basename "$dir")
    prog=$WORK/$name.ogp
    if ! "$BIN" export "$dir" -o "$prog" --max-write 8 --dtype f32 2>"$WORK/export.log"; then
        echo "FAIL $name: export: $(cat "$WORK/export.log")"
        fails=$((fails + 1))
        continue
    fi
    rows=$(tr ',' '\n' <"$dir/tokens.txt" | grep -c .)
    ran_any=0
    for chunk in whole 1 5; do
        one=$WORK/$name.1.$chunk.f32
        args=(eval -m "$prog" --tokens "@$dir/tokens.txt" --kv-dtype f32 --backend cpu -t 1)
        [ "$chunk" = whole ] || args+=(--chunk "$chunk")
        eval_to "$name chunk=$chunk: the unsharded eval" "$one" "${args[@]}" || continue
        for n in 2 3 4 8; do
            out=$WORK/$name.$n.$chunk.f32
            runs=$((runs + 1))
            eval_to "$name tp=$n chunk=$chunk" "$out" "${args[@]}" -tp "$n" || continue
            ran_any=1
            case "$ran_n" in *" $n "*) ;; *) ran_n="$ran_n$n " ;; esac
            against "$name tp=$n chunk=$chunk" "$out" "$one" "$rows" "$dir/logits.f32"
        done
    done
    if [ "$ran_any" = 0 ]; then
        echo "FAIL $name: no shard count ran"
        fails=$((fails + 1))
    fi
done
for n in 2 3 4 8; do
    case "$ran_n" in *" $n "*) ;; *) echo "FAIL: no fixture ran at tp=$n"; fails=$((fails + 1)) ;; esac
done
# int8 / fp8 KV storage cut by heads: the fixtures with several kv heads, fed
# one token a step, against the unsharded run of the same storage dtype
# (quantized the same way per head and token). Not within the reduction-order
# bound: where the reduction order moves a k or v value across a rounding
# boundary of the storage, that element moves by a whole quant step (int8:
# amax / 127 of its head's row; fp8 e4m3: up to 1/8 of its magnitude), which
# moved the logits by 0.0108 once (qwen3-mixed, fp8, tp=2, on an AVX2 host;
# 7.6e-4 for int8). The bound is 0.05: a head or column cut wrong moves the
# logits by O(1), and the arg-max must still agree wherever the two best
# logits lie further apart than that (compare_logits).
for name in llama-gqa qwen3-mixed qwen35-dense; do
    dir=$SRC/tests/data/hf/$name
    prog=$WORK/$name.ogp
    [ -f "$prog" ] || continue
    rows=$(tr ',' '\n' <"$dir/tokens.txt" | grep -c .)
    for kv in int8 fp8; do
        args=(eval -m "$prog" --tokens "@$dir/tokens.txt" --kv-dtype "$kv" --backend cpu -t 1 --chunk 1)
        one=$WORK/$name.1.$kv.f32
        eval_to "$name kv=$kv: the unsharded eval" "$one" "${args[@]}" || continue
        for n in 2 4 8; do
            out=$WORK/$name.$n.$kv.f32
            runs=$((runs + 1))
            eval_to "$name tp=$n kv=$kv" "$out" "${args[@]}" -tp "$n" &&
                against "$name tp=$n kv=$kv" "$out" "$one" "$rows" "" 0.05
        done
    done
done
# a shard count out of range is refused by name, and so is the cuda back end
if "$BIN" eval -m "$WORK/llama-gqa.ogp" --tokens 1,2 --logits-out "$WORK/x" -tp 9 2>"$WORK/eval.log" ||
    ! grep -q -- "-tp" "$WORK/eval.log"; then
    echo "FAIL: -tp 9: $(cat "$WORK/eval.log")"
    fails=$((fails + 1))
fi
if "$BIN" eval -m "$WORK/llama-gqa.ogp" --tokens 1,2 --logits-out "$WORK/x" -tp 2 --backend cuda 2>"$WORK/eval.log" ||
    ! grep -q "tensor parallel\|no CUDA back end" "$WORK/eval.log"; then
    echo "FAIL: -tp 2 --backend cuda: $(cat "$WORK/eval.log")"
    fails=$((fails + 1))
fi
# --devices (llama.cpp's -dev): refused by name when it cannot be one CUDA
# device a shard; the message must say what is wrong
refused() { # $1: what the message must hold; the rest: eval's options
    local want=$1
    shift
    if "$BIN" eval -m "$WORK/llama-gqa.ogp" --tokens 1,2 --logits-out "$WORK/x" "$@" 2>"$WORK/eval.log" ||
        ! grep -q -- "$want" "$WORK/eval.log"; then
        echo "FAIL: $*: wanted a refusal naming \"$want\", got: $(cat "$WORK/eval.log")"
        fails=$((fails + 1))
    else
        echo "ok   $* refused: $(head -1 "$WORK/eval.log")"
    fi
}
refused "devices name CUDA devices" --backend cpu --devices 0
refused "devices name CUDA devices" --backend cpu -dev CUDA0,CUDA1 -tp 2
refused "device 1 given twice" --devices 1,1 -tp 2 --backend cpu
refused "1 device for 2 shards" --devices 0 -tp 2
refused "expects CUDA device numbers" --devices 0,x
refused "at most 8 devices" --devices 0,1,2,3,4,5,6,7,8
# the Python binding's Model(tensor_parallel=): the same logits as the tool's at N = 4
LIB=$(dirname "$BIN")/liboffgraph.so
. "$SRC/tests/python/sanitizer_env.sh"
if [ -f "$LIB" ] && command -v python3 >/dev/null && og_python_sanitizer_env "$(dirname "$BIN")" cli_tensor_parallel; then
    runs=$((runs + 1))
    if ! out=$(env "${SAN_ENV[@]}" OFFGRAPH_LIB="$LIB" PYTHONPATH="$SRC/python" python3 - "$WORK/llama-gqa.ogp" "$WORK/llama-gqa.4.whole.f32" \
        "$SRC/tests/data/hf/llama-gqa/tokens.txt" 2>"$WORK/python.log" <<'PY'
import array, sys
import offgraph
prog, ref_path, tok_path = sys.argv[1:4]
toks = [int(t) for t in open(tok_path).read().replace(",", " ").split()]
m = offgraph.Model(prog, backend="cpu", n_threads=1, tensor_parallel=4)
rows = m.session(kv_dtype="f32").eval(toks, logits="all")
ref = array.array("f")
ref.frombytes(open(ref_path, "rb").read())
V = m.vocab_size
d = max(abs(rows[t][v] - ref[t * V + v]) for t in range(len(toks)) for v in range(V))
print("max |difference| %g" % d)
sys.exit(0 if d == 0 else 1)
PY
    ); then
        echo "FAIL python Model(tensor_parallel=4): $out $(cat "$WORK/python.log")"
        fails=$((fails + 1))
    else
        echo "ok   python Model(tensor_parallel=4) against offgraph eval -tp 4: $out"
    fi
fi
echo "$((runs - fails)) passed, $fails failed (shard counts run:$ran_n)"
[ "$fails" -eq 0 ]
