#!/usr/bin/env bash
# Tensor parallel on the CPU (src/exec/shard.c, src/exec/backend_cpu_tp.c):
# every fixture of tests/data/hf (dense, MoE and hybrid) is exported in f32
# and run with offgraph eval cut into N = 2, 3, 4 and 8 shards, whole and fed
# 1 and 5 tokens a step. Each run must either be refused by name (the
# fixture's heads do not divide over N: the message names the instruction)
# or give logits that match
#  - transformers' (the fixture's logits.f32, tests/fixtures/make_hf_fixtures.py)
#    within cli_parity.sh's f32 bound, 0.02, and
#  - the unsharded run's within the reduction-order bound below.
# Every architecture must run at some N > 1, and every N at least once.
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
# 2e-3 (measured 3e-5). A head, column or expert cut wrong moves logits by
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
refused=0
ran_n=" "
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
        if ! "$BIN" "${args[@]}" --logits-out "$one" 2>"$WORK/eval.log"; then
            echo "FAIL $name chunk=$chunk: the unsharded eval: $(cat "$WORK/eval.log")"
            fails=$((fails + 1))
            continue
        fi
        for n in 2 3 4 8; do
            out=$WORK/$name.$n.$chunk.f32
            runs=$((runs + 1))
            if ! "$BIN" "${args[@]}" -tp "$n" --logits-out "$out" 2>"$WORK/eval.log"; then
                if grep -q "tensor parallel $n: instruction [0-9]* (.*): .*divide" "$WORK/eval.log"; then
                    [ "$chunk" = whole ] && echo "ok   $name tp=$n refused: $(grep -o 'instruction.*' "$WORK/eval.log" | head -1 | cut -c1-100)"
                    refused=$((refused + 1))
                else
                    echo "FAIL $name tp=$n chunk=$chunk: $(cat "$WORK/eval.log")"
                    fails=$((fails + 1))
                fi
                continue
            fi
            ran_any=1
            case "$ran_n" in *" $n "*) ;; *) ran_n="$ran_n$n " ;; esac
            if ! ref=$("$CMP" "$out" "$dir/logits.f32" "$rows" 0.02); then
                echo "FAIL $name tp=$n chunk=$chunk against transformers: $ref"
                fails=$((fails + 1))
            elif ! res=$("$CMP" "$out" "$one" "$rows" 0.002); then
                echo "FAIL $name tp=$n chunk=$chunk against one shard: $res"
                fails=$((fails + 1))
            else
                echo "ok   $name tp=$n chunk=$chunk: against one shard $res"
            fi
        done
    done
    if [ "$ran_any" = 0 ]; then
        echo "FAIL $name: no shard count ran"
        fails=$((fails + 1))
    fi
done
for n in 2 3 4; do
    case "$ran_n" in *" $n "*) ;; *) echo "FAIL: no fixture ran at tp=$n"; fails=$((fails + 1)) ;; esac
done
# a cut that does not fit is refused before anything loads, and a bad count by name
if "$BIN" eval -m "$WORK/llama-gqa.ogp" --tokens 1,2 --logits-out "$WORK/x" -tp 9 2>"$WORK/eval.log"; then
    echo "FAIL: -tp 9 was accepted"
    fails=$((fails + 1))
fi
echo "$((runs - fails - refused)) ran, $refused refused by name, $fails failed (shard counts run:$ran_n)"
[ "$fails" -eq 0 ]
