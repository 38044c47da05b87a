#!/usr/bin/env bash
# GGUF k-quant files on the CPU, offgraph and llama.cpp side by side on the
# very same files: bench/cpu.sh's Qwen3-0.6B-shaped checkpoint written as a
# llama-architecture bf16 GGUF (bench/make_gguf.py --arch llama, which
# llama.cpp builds from before qwen3 load; the same matrices, no q / k
# norms), quantized by llama.cpp's own llama-quantize to Q8_0, Q6_K and
# Q4_K_M. offgraph exports each file (its matrices kept as stored: q8, q6_k,
# and Q4_K_M's mix of q4_k / q6_k) and both time decode (32 tokens after a
# one-token prompt: llama-bench's tg32) and a 128-token prefill, on every
# core; each decode also against its bytes floor (the file's bytes over the
# copy rate bench_copy measures in the same run).
#   LLAMA_DIR=<llama.cpp source tree with a build/ of llama-bench and
#   llama-quantize> bash bench/cpu_kquant.sh [build-dir] [scratch-dir]
# LLAMA_BENCH / LLAMA_QUANTIZE name the binaries otherwise; TYPES (default
# "Q8_0 Q6_K Q4_K_M BF16") the files; needs python3-numpy.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
work=${2:-${TMPDIR:-/tmp}/offgraph-bench}
root=$(cd "$(dirname "$0")/.." && pwd)
llama_dir=${LLAMA_DIR:?set LLAMA_DIR to a llama.cpp source tree with its build (bench/cpu_kquant.sh)}
lbench=${LLAMA_BENCH:-$llama_dir/build/bin/llama-bench}
lquant=${LLAMA_QUANTIZE:-$llama_dir/build/bin/llama-quantize}
for b in "$lbench" "$lquant"; do [[ -x $b ]] || { echo "bench/cpu_kquant.sh: no $b" >&2; exit 1; }; done
py=${PYTHON:-/usr/bin/python3}
mkdir -p "$work"
[[ -f $work/hf/model.safetensors ]] || "$py" "$root/tests/fixtures/make_synthetic_checkpoints.py" --qwen3-0.6b "$work/hf"
base=$work/llama-0.6b.BF16.gguf
if [[ ! -f $base ]]; then
  echo "writing $base (llama architecture, bf16)" >&2
  PYTHONPATH=$llama_dir/gguf-py${PYTHONPATH:+:$PYTHONPATH} "$py" "$root/bench/make_gguf.py" "$work/hf" "$base.part" --arch llama >&2
  mv "$base.part" "$base"
fi
copy=$("$build/bench/bench_copy" | tee /dev/stderr | grep -o '[0-9.]* GB/s' | grep -o '^[0-9.]*')
threads=${THREADS:-$(nproc)}
field() { echo "$1" | grep -o "\"$2\":[0-9.]*" | cut -d: -f2; }
lts() { echo "$1" | grep "\"n_prompt\": *$2," | grep "\"n_gen\": *$3," | grep -o '"avg_ts": *[0-9.e+-]*' | grep -o '[0-9.e+-]*$'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
printf '\n%-8s %9s | %10s %10s %7s %9s | %11s %11s %7s\n' file MB "decode og" "llama.cpp" ratio "og/floor" "prefill og" "llama.cpp" ratio
for t in ${TYPES:-Q8_0 Q6_K Q4_K_M BF16}; do
  f=$work/llama-0.6b.$t.gguf
  if [[ ! -f $f ]]; then
    echo "llama-quantize -> $f" >&2
    "$lquant" "$base" "$f.part" "$t" "$threads" >"$work/quantize.$t.log" 2>&1 || { cat "$work/quantize.$t.log" >&2; exit 1; }
    mv "$f.part" "$f"
  fi
  p=$work/llama-0.6b.$t.ogp
  [[ -f $p ]] || "$build/offgraph" export "$f" -o "$p" --max-context 4096 >&2
  og_dec=$(field "$("$build/offgraph" bench -m "$p" --backend cpu --threads "$threads" --json --prompt 1 --gen 32)" decode_tokens_per_s)
  og_pre=$(field "$("$build/offgraph" bench -m "$p" --backend cpu --threads "$threads" --json --prompt 128 --gen 1)" prefill_tokens_per_s)
  rows=$("$lbench" -m "$f" -t "$threads" -o jsonl -p 128 -n 32 2>>"$work/llama-bench.log")
  l_dec=$(lts "$rows" 0 32) l_pre=$(lts "$rows" 128 0)
  bytes=$(stat -c %s "$f")
  floor=$(awk -v c="$copy" -v b="$bytes" 'BEGIN { printf "%.1f", c * 1e9 / b }')
  printf '%-8s %9.0f | %10.1f %10.1f %7s %8.0f%% | %11.1f %11.1f %7s\n' "$t" "$(awk -v b="$bytes" 'BEGIN{print b/1e6}')" \
    "$og_dec" "$l_dec" "$(ratio "$og_dec" "$l_dec")" "$(awk -v a="$og_dec" -v f="$floor" 'BEGIN{print 100*a/f}')" \
    "$og_pre" "$l_pre" "$(ratio "$og_pre" "$l_pre")"
done
printf 'copy rate %s GB/s, %s threads; llama.cpp build %s\n' "$copy" "$threads" \
  "$(echo "$rows" | grep -o '"build_commit": *"[^"]*"' | head -1 | cut -d'"' -f4)"
