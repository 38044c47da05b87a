#!/usr/bin/env bash
# Where the GPU time of a decode step goes: every kernel of a few decode steps
# of a Qwen3 shape (random bf16 weights; 0.6b, 8b or 32b as peer.py
# make-qwen3 makes them) under Nsight Compute (ncu), summed per kernel name,
# from a folder made by tests/gpu/pack.sh.
#   bench/gpu/profile.sh <build-dir> [context, default 128] [shape, default 0.6b]
# PROFILE_WORK names a folder holding qwen3/ and qwen3.ogp of that shape to reuse.
# Prints ncu's per-kernel summary (invocations, mean duration) to stdout and
# $RESULTS_DIR/profile.log; compare the summed kernel time per token with the
# wall time per token that `offgraph bench` reports to see what launches and
# the host cost on top.
set -u
B=$(cd "${1:?usage: bench/gpu/profile.sh <build-dir> [context]}" && pwd)
CTX=${2:-128}
SHAPE=${3:-0.6b}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
RES=${RESULTS_DIR:-$B/results}
mkdir -p "$RES"
LOG=$RES/profile.log
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
WORK=${PROFILE_WORK:-$(mktemp -d)}
if [ ! -f "$WORK/qwen3.ogp" ]; then
    python3 "$SRC/bench/gpu/peer.py" make-qwen3 "$WORK/qwen3" "$SHAPE" >>"$LOG" 2>&1
    "$B/offgraph" export "$WORK/qwen3" -o "$WORK/qwen3.ogp" --max-context 8192 >>"$LOG" 2>&1 || {
        echo "export failed (see $LOG)"
        exit 1
    }
fi
"$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --prompt "$CTX" --gen 256 | tee -a "$LOG"
ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    "$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --prompt "$CTX" --gen 3 2>&1 |
    grep -v '^==PROF==' >"$RES/profile-summary.txt"
grep -E '^ +[A-Za-z_].*\(|gpu__time_duration|^ +Invocations' "$RES/profile-summary.txt" | head -200
