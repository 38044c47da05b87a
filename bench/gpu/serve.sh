#!/usr/bin/env bash
# offgraph serve under load on the GPU: bench/serve.sh (N concurrent streaming
# clients over loopback) on the Qwen3-0.6B shape with random bf16 weights,
# from a folder made by tests/gpu/pack.sh. Random weights sample any of the
# 151,936 ids, so the checkpoint gets a tokenizer padded to its whole
# vocabulary (bench/gpu/peer.py qwen3-tokenizer); the prompts are short
# English phrases, so the figures are those of decode under continuous
# batching with prompts joining all the time.
#   bench/gpu/serve.sh <build-dir>
# Environment: LEVELS (default "1 16 64"), MAXTOK (output tokens a request,
# default 256), BENCH_SECONDS (per level, default 20), MAX_SESSIONS (the
# server's --max-sessions; default: the server's own, 256 on the GPU),
# WORK (a folder holding qwen3/ and qwen3-serve.ogp to reuse; default: made
# here).
set -u
B=$(cd "${1:?usage: bench/gpu/serve.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PEER="python3 $SRC/bench/gpu/peer.py"
OWN=
if [ -z "${WORK:-}" ]; then
    WORK=$(mktemp -d)
    OWN=1
fi
if [ ! -f "$WORK/qwen3-serve.ogp" ]; then
    [ -f "$WORK/qwen3/config.json" ] || $PEER make-qwen3 "$WORK/qwen3" >&2 || exit 1
    $PEER qwen3-tokenizer "$WORK/qwen3" "$SRC/tests/data/hf/qwen3-mixed" >&2 || exit 1
    "$B/offgraph" export "$WORK/qwen3" -o "$WORK/qwen3-serve.ogp" --max-context 8192 >&2 || exit 1
fi
sargs=()
[ -n "${MAX_SESSIONS:-}" ] && sargs=(--max-sessions "$MAX_SESSIONS")
MAXTOK=${MAXTOK:-256} LEVELS=${LEVELS:-"1 16 64"} BENCH_SECONDS=${BENCH_SECONDS:-20} \
    bash "$SRC/bench/serve.sh" "$B" -- -m "$WORK/qwen3-serve.ogp" --backend cuda "${sargs[@]}"
rc=$?
[ -n "$OWN" ] && rm -rf "$WORK"
exit $rc
