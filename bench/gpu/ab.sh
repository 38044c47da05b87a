#!/usr/bin/env bash
# One model decoded by two builds in turn, in one run on one machine, so that a
# change is measured beside the build before it (a card's figures drift from
# machine to machine and from run to run more than most changes move them):
# `offgraph bench` of each build, round after round, at each session count,
# then each build's median and the ratio B / A.
#   bench/gpu/ab.sh <build-a> <build-b> [model.ogp]
# Builds are folders made by tests/gpu/pack.sh (their offgraph and lib/), or any
# folders holding an offgraph. Without a model, a Qwen3 checkpoint of SHAPE
# (default 8b: random bf16 weights by peer.py make-qwen3, which needs torch and
# transformers) is exported by build A with --weights WEIGHTS (default q4_k_m)
# into WORK (default a new temporary folder; a WORK that already holds
# model.ogp is reused).
# Environment: ROUNDS (default 2), SESSIONS (default "1 2"), PROMPT (default
# 512), GEN (default 128), BACKEND (default cuda), ENV_A / ENV_B (assignments
# for each build's runs, e.g. ENV_B="OG_CUDA_KQUANT_GEMV=v2" with the same
# build twice compares two settings of one build), RUN_TIMEOUT (seconds a
# bench run may take, default 120). Each run's whole output is appended to
# $RESULTS_DIR/ab.log (default WORK).
set -u
A=$(cd "${1:?usage: bench/gpu/ab.sh <build-a> <build-b> [model.ogp]}" && pwd)
B=$(cd "${2:?usage: bench/gpu/ab.sh <build-a> <build-b> [model.ogp]}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
for b in "$A" "$B"; do
    [ -x "$b/offgraph" ] || { echo "bench/gpu/ab.sh: no offgraph in $b" >&2; exit 2; }
done
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
RES=${RESULTS_DIR:-$WORK}
mkdir -p "$RES"
LOG=$RES/ab.log
SHAPE=${SHAPE:-8b} WEIGHTS=${WEIGHTS:-q4_k_m} ROUNDS=${ROUNDS:-2} SESSIONS=${SESSIONS:-1 2}
PROMPT=${PROMPT:-512} GEN=${GEN:-128} BACKEND=${BACKEND:-cuda} ENV_A=${ENV_A:-} ENV_B=${ENV_B:-}
MODEL=${3:-}
if [ -z "$MODEL" ]; then
    MODEL=$WORK/model.ogp
    if [ ! -f "$MODEL" ]; then
        echo "making a $SHAPE checkpoint in $WORK/hf, then $MODEL (--weights $WEIGHTS)" >&2
        python3 "$SRC/bench/gpu/peer.py" make-qwen3 "$WORK/hf" "$SHAPE" >>"$LOG" 2>&1 || {
            echo "bench/gpu/ab.sh: peer.py make-qwen3 failed (see $LOG)" >&2
            exit 1
        }
        LD_LIBRARY_PATH=$A/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$A/offgraph" export "$WORK/hf" -o "$MODEL.part" \
            --weights "$WEIGHTS" --max-context 8192 >>"$LOG" 2>&1 || {
            echo "bench/gpu/ab.sh: export failed (see $LOG)" >&2
            rm -f "$MODEL.part"
            exit 1
        }
        mv "$MODEL.part" "$MODEL"
    fi
fi
[ -f "$MODEL" ] || { echo "bench/gpu/ab.sh: no model $MODEL" >&2; exit 2; }
# one bench run: prints its aggregate decode tok/s, or nothing when it failed
run() {
    local build=$1 envs=$2 k=$3 out
    local args=(bench -m "$MODEL" --backend "$BACKEND" --prompt "$PROMPT" --gen "$GEN")
    [ "$k" -gt 1 ] && args+=(--sessions "$k")
    # shellcheck disable=SC2086 # ENV_A / ENV_B are word lists of assignments
    out=$(env LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" $envs \
        timeout "${RUN_TIMEOUT:-120}" "$build/offgraph" "${args[@]}" 2>&1)
    { echo "==== $build ($envs) sessions $k"; echo "$out"; } >>"$LOG"
    echo "$out" | awk '/decode, all/ {print $3}'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
declare -A got
for r in $(seq "$ROUNDS"); do
    for k in $SESSIONS; do
        for side in A B; do
            if [ $side = A ]; then v=$(run "$A" "$ENV_A" "$k"); else v=$(run "$B" "$ENV_B" "$k"); fi
            echo "round $r, $k session(s), $side: ${v:-failed} tok/s"
            got[$side$k]="${got[$side$k]:-} $v"
        done
    done
done
echo
echo "model $MODEL, backend $BACKEND, prompt $PROMPT, gen $GEN, $ROUNDS rounds"
echo "A: $A $ENV_A"
echo "B: $B $ENV_B"
printf '%-9s %-24s %-24s %s\n' sessions "A tok/s (median)" "B tok/s (median)" "B / A"
fails=0
for k in $SESSIONS; do
    ma=$(echo "${got[A$k]:-}" | median) mb=$(echo "${got[B$k]:-}" | median)
    ratio=$(awk -v a="${ma:-0}" -v b="${mb:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", b / a; else print "-" }')
    printf '%-9s %-24s %-24s %s\n' "$k" "${got[A$k]:-} (${ma:--})" "${got[B$k]:-} (${mb:--})" "$ratio"
    [ "$ratio" = - ] && fails=$((fails + 1))
done
echo "log: $LOG"
[ "$fails" -eq 0 ]
