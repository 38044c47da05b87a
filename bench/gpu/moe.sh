#!/usr/bin/env bash
# Decode of the Qwen3-30B-A3B shape (48 layers, hidden 2048, 32/4 heads of
# 128, 128 experts of 768, top 8, vocab 151936; random bf16 weights, about
# 61 GB, made by tests/fixtures/make_synthetic_checkpoints.py --qwen3-moe
# 30b-a3b --fused --sparse-experts: the routed experts' weights are zeros
# kept as holes of the file, so the checkpoint takes about 3 GB of disk; the
# router and the rest are random, so tokens spread over the experts) on the
# GPU, from a folder made by tests/gpu/pack.sh: one session
# and 16 / 64 / 256 sessions (aggregate), bf16 and q4 experts, against the
# activated-bytes floor (the bytes one token reads: attention, the router,
# 8 experts of 128, the head, over the copy rate COPY in bytes/s, default
# 4.24e12: an H200's device-to-device read + write rate as bench/gpu/run.sh
# measures it; set COPY for another GPU).
#   bench/gpu/moe.sh <build-dir>
# Environment: WORK (a folder to keep the checkpoint and programs in;
# default /tmp/offgraph-moe30b), KS (default "1 16 64 256"), CTX (prompt,
# default 512), GEN (default 64).
# Each program is removed after its runs (KEEP=1 keeps them): the bf16 one
# is 61 GB. Then transformers decodes the same checkpoint (bf16, batch 1,
# bench/gpu/peer.py generate) unless PEER=0.
set -u
B=$(cd "${1:?usage: bench/gpu/moe.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/offgraph-moe30b}
KS=${KS:-1 16 64 256}
CTX=${CTX:-512}
GEN=${GEN:-64}
COPY=${COPY:-4.24e12}
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OG_CUDA_MOE=1
mkdir -p "$WORK"
if [ ! -f "$WORK/hf/config.json" ]; then
    echo "making the 30B-A3B-shaped checkpoint in $WORK/hf (about 61 GB)" >&2
    python3 "$SRC/tests/fixtures/make_synthetic_checkpoints.py" --qwen3-moe 30b-a3b "$WORK/hf" --fused --sparse-experts || exit 1
fi
# activated bytes per token: per layer q/k/v/o 2048 x (4096 + 512 + 512) +
# 4096 x 2048 weights and 8 x 3 x 768 x 2048 expert weights in the weights'
# dtype, the router 128 x 2048 bf16; the head 151936 x 2048 (q4 too); KV of
# the context: 48 x 2 x 4 x 128 x 2 bytes a position
activated() { # $1 bytes per weight, $2 context
    awk -v b="$1" -v n="$2" 'BEGIN { layer = (2048 * 5120 + 4096 * 2048 + 8 * 3 * 768 * 2048) * b + 128 * 2048 * 2
        printf "%.0f", 48 * layer + (151936 * 2048 + 2048) * b + 48 * 2 * 4 * 128 * 2 * n }'
}
. "$SRC/bench/gpu/sessions.sh"
printf '%-10s %-5s %12s %12s %10s %8s\n' weights K "tok/s (all)" "per session" "floor(1)" ratio
for w in ${WEIGHTS:-q4 bf16}; do
    [ -f "$WORK/moe.$w.ogp" ] || "$B/offgraph" export "$WORK/hf" -o "$WORK/moe.$w.ogp" --weights "$w" --max-context 4096 >&2 || exit 1
    case $w in bf16) b=2 ;; q4) b=0.5625 ;; esac
    floor=$(awk -v c="$COPY" -v by="$(activated $b $CTX)" 'BEGIN { printf "%.1f", c / by }')
    session_rows "$w" "$WORK/moe.$w.ogp" "$floor" "$WORK/moe.jsonl"
    [ "${KEEP:-0}" = 1 ] || rm -f "$WORK/moe.$w.ogp"
done
if [ "${PEER:-1}" = 1 ]; then
    echo "transformers, bf16, batch 1 (context $CTX, $GEN generated):"
    python3 "$SRC/bench/gpu/peer.py" generate "$WORK/hf" "$CTX" "$GEN"
fi
