#!/usr/bin/env bash
# Decode and prefill of the Qwen3.5-35B-A3B text model's shape (40 layers:
# 30 Gated DeltaNet layers with per-session state and 10 gated full-attention
# layers, hidden 2048, 256 experts of 512, top 8, a shared expert of 512,
# vocab 248320; random bf16 weights, about 70 GB, made by
# tests/fixtures/make_synthetic_checkpoints.py --qwen3.5-moe 35b-a3b
# --sparse-experts: the routed experts' weights are zeros kept as holes of
# the file, so it takes about 5 GB of disk; the router and the rest are
# random) on the GPU, from a folder made by tests/gpu/pack.sh: one session
# and 16 / 64 sessions (aggregate), prefill of 4096 tokens, against the
# activated-bytes floor (the bytes one token moves: the weights it reads,
# the KV of the context and the recurrent state read and written, over the
# copy rate COPY in bytes/s, default 4.24e12: an H200's device-to-device
# read + write rate as bench/gpu/run.sh measures it; set COPY for another GPU).
#   bench/gpu/hybrid.sh <build-dir>
# Environment: WORK (default /tmp/offgraph-hybrid35b), KS (default
# "1 16 64"), CTX (prompt, default 512), GEN (default 64), WEIGHTS (default
# q4; bf16 needs 70 GB of disk for its program), KEEP=1 keeps the programs,
# PEER=0 skips transformers (bf16, batch 1, bench/gpu/peer.py generate).
set -u
B=$(cd "${1:?usage: bench/gpu/hybrid.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/offgraph-hybrid35b}
KS=${KS:-1 16 64}
CTX=${CTX:-512}
GEN=${GEN:-64}
COPY=${COPY:-4.24e12}
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$WORK"
if [ ! -f "$WORK/hf/config.json" ]; then
    echo "making the 35B-A3B-shaped checkpoint in $WORK/hf (about 70 GB, sparse)" >&2
    python3 "$SRC/tests/fixtures/make_synthetic_checkpoints.py" --qwen3.5-moe 35b-a3b "$WORK/hf" --sparse-experts || exit 1
fi
# bytes one token moves, $1 bytes per weight, $2 context: 30 linear layers
# (in_proj_qkv 8192 + z 4096 + a 32 + b 32 rows and out_proj 2048 x 4096),
# 10 full layers (q 8192 rows with its gate, k 512, v 512, o 2048 x 4096),
# 40 expert layers (8 of 3 x 512 x 2048, the shared 3 x 512 x 2048; router
# 256 x 2048 bf16), the head 248320 x 2048; the KV of 10 layers (2 x 2 heads
# x 256 x 2 bytes a position) and 30 states of 32 x 128 x 128 f32, read and
# written
moved() {
    awk -v b="$1" -v n="$2" 'BEGIN { h = 2048
        lin = (8192 + 4096 + 32 + 32) * h + h * 4096; full = (8192 + 512 + 512) * h + h * 4096
        moe = (8 + 1) * 3 * 512 * h
        w = (30 * lin + 10 * full + 40 * moe + 248320 * h) * b + 40 * 256 * h * 2
        printf "%.0f", w + 10 * 2 * 2 * 256 * 2 * n + 2 * 30 * 32 * 128 * 128 * 4 }'
}
. "$SRC/bench/gpu/sessions.sh"
printf '%-8s %-7s %12s %12s %10s %8s\n' weights K "tok/s (all)" "per session" "floor(1)" ratio
for w in ${WEIGHTS:-q4}; do
    [ -f "$WORK/hybrid.$w.ogp" ] || "$B/offgraph" export "$WORK/hf" -o "$WORK/hybrid.$w.ogp" --weights "$w" --max-context 8192 >&2 || exit 1
    case $w in bf16) b=2 ;; q8) b=1.0625 ;; q4) b=0.5625 ;; esac
    floor=$(awk -v c="$COPY" -v by="$(moved $b $CTX)" 'BEGIN { printf "%.1f", c / by }')
    session_rows "$w" "$WORK/hybrid.$w.ogp" "$floor" "$WORK/hybrid.jsonl"
    r=$("$B/offgraph" bench -m "$WORK/hybrid.$w.ogp" --backend cuda --json --prompt 4096 --gen 8)
    printf '%-8s prefill of 4096 tokens: %s tok/s\n' "$w" "$(field "$r" prefill_tokens_per_s)"
    echo "$r" >>"$WORK/hybrid.jsonl"
    [ "${KEEP:-0}" = 1 ] || rm -f "$WORK/hybrid.$w.ogp"
done
if [ "${PEER:-1}" = 1 ]; then
    echo "transformers, bf16, batch 1 (context $CTX, $GEN generated):"
    python3 "$SRC/bench/gpu/peer.py" generate "$WORK/hf" "$CTX" "$GEN"
fi
