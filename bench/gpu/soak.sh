#!/usr/bin/env bash
# Soak of offgraph serve on a GPU: bench/soak.sh (a mixed load over loopback,
# sampled every 10 s, then the table and the verdict) on the Qwen3-0.6B shape
# with random bf16 weights (the checkpoint and tokenizer bench/gpu/serve.sh
# makes), 256 clients, requests queueing behind --max-sessions 256 and a
# tight --kv-budget, some of them getting 429.
#   bench/gpu/soak.sh <build-dir>
# Environment: SOAK_SECONDS (default 540: with the checkpoint's making, under
# ten minutes), SOAK_CLIENTS (default 256), KV_BUDGET (default 6G: about 200
# sessions at 256 tokens), WORK (a folder holding qwen3/ and
# qwen3-soak.ogp to reuse; default: made here).
set -u
B=$(cd "${1:?usage: bench/gpu/soak.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PEER="python3 $SRC/bench/gpu/peer.py"
OWN=
if [ -z "${WORK:-}" ]; then
    WORK=$(mktemp -d)
    OWN=1
fi
if [ ! -f "$WORK/qwen3-soak.ogp" ]; then
    [ -f "$WORK/qwen3/config.json" ] || $PEER make-qwen3 "$WORK/qwen3" >&2 || exit 1
    $PEER qwen3-tokenizer "$WORK/qwen3" "$SRC/tests/data/hf/qwen3-mixed" >&2 || exit 1
    "$B/offgraph" export "$WORK/qwen3" -o "$WORK/qwen3-soak.ogp" --max-context 2048 >&2 || exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
SOAK_SECONDS=${SOAK_SECONDS:-540} SOAK_CLIENTS=${SOAK_CLIENTS:-256} SOAK_CONTEXT=2048 \
    bash "$SRC/bench/soak.sh" "$B" -- -m "$WORK/qwen3-soak.ogp" --backend cuda --max-sessions 256 --max-queue 64 \
    --kv-budget "${KV_BUDGET:-6G}"
rc=$?
[ -n "$OWN" ] && rm -rf "$WORK"
exit $rc
