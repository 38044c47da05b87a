#!/usr/bin/env bash
# Where the GPU time of a decode step goes, from a folder made by
# tests/gpu/pack.sh: `offgraph bench` of a Qwen3 shape (random bf16 weights,
# 0.6b, 8b or 32b as peer.py make-qwen3 makes them) at each batch size of KS,
# under OG_CUDA_PROFILE (src/exec/profile_cuda.h): the device time of every
# launch step summed per label (a product's K -> N and weight dtype, or its
# ops), with the GB/s of each product's weights, one table per step shape;
# decode steps replay their graphs, with the events inside them.
#   bench/gpu/profile.sh <build-dir> [context, default 128] [shape, default 0.6b]
# Environment: KS (sessions, default "1"), GEN (decode tokens, default 32),
# WEIGHTS (bf16, q8 or q4: export --weights), PROFILE_WORK (a folder holding
# qwen3/ and qwen3.ogp of that shape to reuse), NCU=1 (also the per-kernel
# summary of Nsight Compute, ncu, for one session: $RESULTS_DIR/profile-ncu.txt).
# The bench runs twice, without and with the profile (printed first: the
# step's phases); the difference is what the events cost.
set -u
B=$(cd "${1:?usage: bench/gpu/profile.sh <build-dir> [context] [shape]}" && pwd)
CTX=${2:-128}
SHAPE=${3:-0.6b}
KS=${KS:-1}
GEN=${GEN:-32}
WEIGHTS=${WEIGHTS:-bf16}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
RES=${RESULTS_DIR:-$B/results}
mkdir -p "$RES"
LOG=$RES/profile.log
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
WORK=${PROFILE_WORK:-$(mktemp -d)}
if [ ! -f "$WORK/qwen3.ogp" ]; then
    python3 "$SRC/bench/gpu/peer.py" make-qwen3 "$WORK/qwen3" "$SHAPE" >>"$LOG" 2>&1
    wargs=()
    [ "$WEIGHTS" != bf16 ] && wargs=(--weights "$WEIGHTS")
    "$B/offgraph" export "$WORK/qwen3" -o "$WORK/qwen3.ogp" --max-context 8192 "${wargs[@]}" >>"$LOG" 2>&1 || {
        echo "export failed (see $LOG)"
        exit 1
    }
fi
for k in $KS; do
    out=$RES/profile-$SHAPE-$WEIGHTS-ctx$CTX-k$k.txt
    : >"$out"
    echo "== $SHAPE $WEIGHTS, context $CTX, $k session(s): offgraph bench, then again under the profile" |
        tee -a "$LOG"
    "$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --sessions "$k" --prompt "$CTX" --gen "$GEN" 2>&1 |
        tail -n 4 | tee -a "$LOG"
    OG_CUDA_PROFILE=$out "$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --sessions "$k" --prompt "$CTX" \
        --gen "$GEN" 2>&1 | tail -n 4 | tee -a "$LOG"
    # the decode steps' table: k sessions of one row each
    awk -v k="$k" '/^# CUDA device time/ { on = ($0 ~ (" of " k " session(s)?, " k " row(s)?:")) } on' "$out" |
        head -n 40 | tee -a "$LOG"
done
if [ "${NCU:-0}" = 1 ]; then
    ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
        "$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --prompt "$CTX" --gen 3 2>&1 |
        grep -v '^==PROF==' >"$RES/profile-ncu.txt"
fi
