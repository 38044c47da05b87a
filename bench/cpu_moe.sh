#!/usr/bin/env bash
# CPU benchmark of a small mixture-of-experts model: Qwen3-MoE, 12 layers,
# hidden 1024, 8/4 heads of 128, 8 experts of 1024 (top 2) in every layer,
# vocab 8192, untied, random bf16 weights (a random router, so that tokens
# spread over the experts). Decode tokens/s of one session at context 128
# against the activated-bytes floor: the bytes a token reads (attention, the
# router, its 2 experts of 8, the head, the KV rows) over the machine's copy
# rate, for bf16, q8 and q4 experts; and the aggregate of 8 sessions, whose
# rows share the experts they pick.
#   bash bench/cpu_moe.sh [build-dir] [scratch-dir]     (needs python3-numpy)
set -euo pipefail
build=${1:-build}
work=${2:-${TMPDIR:-/tmp}/offgraph-bench-moe}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
if [[ ! -f $work/hf/config.json ]]; then
  echo "making a small Qwen3-MoE checkpoint (680 MB) in $work/hf" >&2
  "${PYTHON:-/usr/bin/python3}" "$root/tests/fixtures/make_synthetic_checkpoints.py" --qwen3-moe bench "$work/hf"
fi
for w in bf16 q8 q4; do
  [[ -f $work/moe.$w.ogp ]] || "$build/offgraph" export "$work/hf" -o "$work/moe.$w.ogp" --weights "$w" >&2
done
copy=$("$build/bench/bench_copy" | tee /dev/stderr | grep -o '[0-9.]* GB/s' | grep -o '^[0-9.]*')
# bytes a decode token reads, per weight dtype: per layer q/k/v/o (3,145,728
# weights) and 2 experts x 3 x 1024 x 1024 (6,291,456) in the dtype, the
# router (8 x 1024 bf16, never quantized) and the norms (1024 x 2 + 128 x 2,
# bf16); the head (8192 x 1024) and one embedding row in the dtype, the final
# norm; the KV rows of the context (12 layers x k, v x 4 heads x 128 x 2 bytes)
activated() { # $1: bytes per weight of the dtype, $2: context
  awk -v b="$1" -v n="$2" 'BEGIN {
    layer = (3145728 + 6291456) * b + 8 * 1024 * 2 + (2 * 1024 + 2 * 128) * 2
    printf "%.0f", 12 * layer + (8192 * 1024 + 1024) * b + 1024 * 2 + 12 * 2 * 4 * 128 * 2 * n }'
}
field() { echo "$1" | grep -o "\"$2\":[0-9.]*" | cut -d: -f2; }
printf '\n%-40s %10s %10s %8s %14s\n' "figure" "offgraph" "floor" "ratio" "bytes/token"
for w in bf16 q8 q4; do
  case $w in bf16) b=2 ;; q8) b=1.0625 ;; q4) b=0.5625 ;; esac
  bytes=$(activated $b 144)
  r=$("$build/offgraph" bench -m "$work/moe.$w.ogp" --backend cpu --json --prompt 128 --gen 32)
  d=$(field "$r" decode_tokens_per_s)
  f=$(awk -v c="$copy" -v by="$bytes" 'BEGIN { printf "%.1f", c * 1e9 / by }')
  printf '%-40s %10.1f %10s %7.0f%% %14s\n' "decode tok/s, 1 session, $w" "$d" "$f" \
    "$(awk -v a="$d" -v b="$f" 'BEGIN{print 100*a/b}')" "$bytes"
done
r8=$("$build/offgraph" bench -m "$work/moe.bf16.ogp" --backend cpu --json --prompt 128 --gen 32 --sessions 8)
printf '%-40s %10.1f\n' "decode tok/s, 8 sessions (all), bf16" "$(field "$r8" decode_tokens_per_s)"
printf '%-40s %10.1f\n' "prefill tok/s, 128-token prompt, bf16" "$(field "$r8" prefill_tokens_per_s)"
printf '%-40s %10s GB/s\n' "copy rate (read + written)" "$copy"
