#!/usr/bin/env bash
# CPU benchmark of many sessions decoding together, on the Qwen3-0.6B-shaped
# program that bench/cpu.sh makes: aggregate decode tokens/s (K x GEN over the
# decode time) with K sessions in one batched step (og_model_step) for each K
# in KS, and K = 8 stepped one after another, at context about 128 (prompts
# of PROMPT tokens, then GEN decode tokens). Prints the ratio of 8 batched
# sessions to one; the aim is >= 5, which needs the product kernels to read
# the weights once for all rows of a step.
#   bash bench/cpu_batch.sh [build-dir] [scratch-dir]     (needs python3-numpy)
# Environment: KS (default "1 8 64"), PROMPT (112), GEN (32).
set -euo pipefail
build=${1:-build}
work=${2:-${TMPDIR:-/tmp}/offgraph-bench}
root=$(cd "$(dirname "$0")/.." && pwd)
KS=${KS:-1 8 64}
PROMPT=${PROMPT:-112}
GEN=${GEN:-32}
mkdir -p "$work"
if [[ ! -f $work/qwen3-0.6b.ogp ]]; then
  echo "making a Qwen3-0.6B-shaped checkpoint and exporting it (1.2 GB) in $work" >&2
  "${PYTHON:-/usr/bin/python3}" "$root/tests/fixtures/make_synthetic_checkpoints.py" --qwen3-0.6b "$work/hf"
  "$build/offgraph" export "$work/hf" -o "$work/qwen3-0.6b.ogp" --max-context 32768
fi
run() { "$build/offgraph" bench -m "$work/qwen3-0.6b.ogp" --prompt "$PROMPT" --gen "$GEN" --json "$@" | tee -a "$work/batch.jsonl"; }
field() { echo "$1" | grep -o "\"$2\":[0-9.]*" | cut -d: -f2; }
: >"$work/batch.jsonl"
declare -A agg each
for k in $KS; do
  r=$(run --sessions "$k")
  agg[$k]=$(field "$r" decode_tokens_per_s)
  each[$k]=$(field "$r" decode_tokens_per_s_per_session)
done
r=$(run --sessions 8 --sequential)
seq8=$(field "$r" decode_tokens_per_s)
printf '\ndecode at context %d..%d, Qwen3-0.6B shape, %s\n' "$((PROMPT + 1))" "$((PROMPT + GEN + 1))" "$(nproc) threads"
printf '%-22s %14s %14s\n' "sessions" "aggregate tok/s" "per session"
for k in $KS; do printf '%-22s %14.1f %14.2f\n' "$k, batched" "${agg[$k]}" "${each[$k]}"; done
printf '%-22s %14.1f %14.2f\n' "8, one after another" "$seq8" "$(awk -v a="$seq8" 'BEGIN{print a/8}')"
if [[ -n ${agg[1]:-} && -n ${agg[8]:-} ]]; then
  printf 'batched(8) / single: %.2f (aim >= 5); batched(8) / sequential(8): %.2f\n' \
    "$(awk -v a="${agg[8]}" -v b="${agg[1]}" 'BEGIN{print a/b}')" "$(awk -v a="${agg[8]}" -v b="$seq8" 'BEGIN{print a/b}')"
fi
