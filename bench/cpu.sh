#!/usr/bin/env bash
# CPU benchmark of a model of the Qwen3-0.6B shape (28 layers, hidden 1024,
# intermediate 3072, 16/8 heads of 128, vocab 151936, tied, bf16; zero
# weights: speed does not depend on their values): decode tokens/s at
# context 128 and 4096, prefill tokens/s, the machine's copy rate, and each
# decode figure against its bytes-per-token floor (weight bytes + the KV
# bytes the token reads, over the copy rate).
#   bash bench/cpu.sh [build-dir] [scratch-dir]     (needs python3-numpy)
set -euo pipefail
build=${1:-build}
work=${2:-${TMPDIR:-/tmp}/offgraph-bench}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
if [[ ! -f $work/qwen3-0.6b.ogp ]]; then
  echo "making a Qwen3-0.6B-shaped checkpoint and exporting it (1.2 GB) in $work" >&2
  "${PYTHON:-/usr/bin/python3}" "$root/tests/fixtures/make_synthetic_checkpoints.py" --qwen3-0.6b "$work/hf"
  "$build/offgraph" export "$work/hf" -o "$work/qwen3-0.6b.ogp" --max-context 32768
fi
copy=$("$build/bench/bench_copy" | tee /dev/stderr | grep -o '[0-9.]* GB/s' | grep -o '^[0-9.]*')
weights=1192099840   # bytes of the bf16 weights (offgraph inspect)
kv_per_token=114688  # 28 layers x (k + v) x 8 heads x 128 x 2 bytes
run() { "$build/offgraph" bench -m "$work/qwen3-0.6b.ogp" --backend cpu --json "$@"; }
r128=$(run --prompt 128 --gen 32)
# decode from 4064 to 4096 (after the prompt of 4063 and bench's one untimed
# decode step): inside the capacity the prompt grew the flat layers to (4096
# rows), so no growth (a one-off copy of every layer) lands in the timing
r4096=$(run --prompt 4063 --gen 32)
field() { echo "$1" | grep -o "\"$2\":[0-9.]*" | cut -d: -f2; }
floor() { awk -v c="$copy" -v w="$weights" -v k="$kv_per_token" -v n="$1" 'BEGIN { printf "%.1f", c * 1e9 / (w + k * n) }'; }
printf '\n%-34s %12s %12s %8s\n' "figure" "offgraph" "floor" "ratio"
for ctx in 128 4096; do
  r=r$ctx
  d=$(field "${!r}" decode_tokens_per_s)
  f=$(floor $ctx)
  printf '%-34s %12.1f %12s %7.0f%%\n' "decode tok/s at context $ctx" "$d" "$f" "$(awk -v a="$d" -v b="$f" 'BEGIN{print 100*a/b}')"
done
printf '%-34s %12.1f\n' "prefill tok/s, 128-token prompt" "$(field "$r128" prefill_tokens_per_s)"
# the same prefill without the AMX tile kernel (vdpbf16ps), side by side
r128n=$(OG_CPU_AMX=0 run --prompt 128 --gen 2)
printf '%-34s %12.1f\n' "  same, OG_CPU_AMX=0" "$(field "$r128n" prefill_tokens_per_s)"
printf '%-34s %12.1f\n' "prefill tok/s, 4063-token prompt" "$(field "$r4096" prefill_tokens_per_s)"
# the demo model (kjv-tiny.ogp beside the build's binary: 11 MB of bf16
# weights, which stay in the caches from token to token), decode on 1 and 2
# threads after a 16-token prompt
demo=$build/kjv-tiny.ogp
if [[ -f $demo ]]; then
  for t in 1 2; do
    rd=$("$build/offgraph" bench -m "$demo" --backend cpu --threads "$t" --prompt 16 --gen 512 --json)
    printf '%-34s %12.1f\n' "demo model decode tok/s, $t thread$([[ $t == 1 ]] || echo s)" "$(field "$rd" decode_tokens_per_s)"
  done
else
  echo "demo model rows skipped: no $demo (the build exports it)"
fi
printf '%-34s %12s GB/s\n' "copy rate (read + written)" "$copy"
# llama.cpp side by side, in the same run: its llama-bench on a GGUF of the same
# checkpoint (bench/make_gguf.py), decode over the same positions as offgraph's
# (depth 128 and 4064, 32 tokens) and a 128-token prefill; skipped with a line
# when no llama-bench is found ($LLAMA_BENCH, else build-llama/bin/llama-bench;
# the gguf Python package from $LLAMA_DIR/gguf-py or installed; README, "Speed")
llama_dir=${LLAMA_DIR:-$root/build-llama}
llama_bench=${LLAMA_BENCH:-$llama_dir/bin/llama-bench}
if [[ -x $llama_bench ]]; then
  echo "llama.cpp: timing $llama_bench beside (its log: $work/llama-bench.log)" >&2
  gguf=$work/qwen3-0.6b.gguf
  if [[ ! -f $gguf ]]; then
    [[ -f $work/hf/model.safetensors ]] || "${PYTHON:-/usr/bin/python3}" "$root/tests/fixtures/make_synthetic_checkpoints.py" --qwen3-0.6b "$work/hf"
    PYTHONPATH=$llama_dir/gguf-py${PYTHONPATH:+:$PYTHONPATH} "${PYTHON:-/usr/bin/python3}" "$root/bench/make_gguf.py" "$work/hf" "$gguf.part" >&2 && mv "$gguf.part" "$gguf"
  fi
  lthreads=${LLAMA_THREADS:-$(nproc)}
  lrows=$("$llama_bench" -m "$gguf" -t "$lthreads" -o jsonl -p 0 -n 32 -d 128,4064 2>>"$work/llama-bench.log"; "$llama_bench" -m "$gguf" -t "$lthreads" -o jsonl -p 128 -n 0 2>>"$work/llama-bench.log") || true
  lts() { echo "$lrows" | grep "\"n_prompt\": *$1," | grep "\"n_gen\": *$2," | grep "\"n_depth\": *$3," | grep -o '"avg_ts": *[0-9.e+-]*' | grep -o '[0-9.e+-]*$'; }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
  lrow() { printf '%-34s %12.1f %12.1f %9s\n' "$1" "$2" "${3:-0}" "$(ratio "$2" "${3:-0}")"; }
  printf '\n%-34s %12s %12s %9s\n' "llama.cpp, $lthreads threads" "offgraph" "llama.cpp" "ratio"
  lrow "decode tok/s at context 128" "$(field "$r128" decode_tokens_per_s)" "$(lts 0 32 128)"
  lrow "decode tok/s at context 4096" "$(field "$r4096" decode_tokens_per_s)" "$(lts 0 32 4064)"
  lrow "prefill tok/s, 128-token prompt" "$(field "$r128" prefill_tokens_per_s)" "$(lts 128 0 0)"
  # the demo model beside (its GGUF has no sliding window: llama.cpp's qwen3 attends
  # to the whole context in the 3 ring layers, a few KB more KV read per token)
  if [[ -f $demo ]]; then
    dgguf=$work/kjv-tiny.gguf
    [[ -f $dgguf ]] || { PYTHONPATH=$llama_dir/gguf-py${PYTHONPATH:+:$PYTHONPATH} "${PYTHON:-/usr/bin/python3}" "$root/bench/make_gguf.py" "$root/models/kjv-tiny" "$dgguf.part" >&2 2>>"$work/llama-bench.log" && mv "$dgguf.part" "$dgguf"; }
    drows=$("$llama_bench" -m "$dgguf" -t 1,2 -o jsonl -p 0 -n 512 -d 16 2>>"$work/llama-bench.log") || true
    for t in 1 2; do
      od=$("$build/offgraph" bench -m "$demo" --backend cpu --threads "$t" --prompt 16 --gen 512 --json)
      ld=$(echo "$drows" | grep "\"n_threads\": *$t," | grep -o '"avg_ts": *[0-9.e+-]*' | grep -o '[0-9.e+-]*$') || true
      lrow "demo model decode tok/s, $t thread$([[ $t == 1 ]] || echo s)" "$(field "$od" decode_tokens_per_s)" "$ld"
    done
  fi
  echo "llama.cpp: $llama_bench, $(echo "$lrows" | grep -m1 -o '"build_commit": *"[^"]*"' || echo "no result: see $work/llama-bench.log")"
else
  echo "llama.cpp rows skipped: no llama-bench at $llama_bench (build llama.cpp's llama-bench and set LLAMA_BENCH to it, or put it there; README, \"Speed\")"
fi
# Quantized GGUF files, the very same file on both sides: the bf16 GGUF of
# the checkpoint quantized by llama.cpp's llama-quantize to each type of
# KQUANT_TYPES (default Q4_K_M Q6_K Q8_0; zero weights: every block zero, the
# bytes read per token those of a real file), exported by offgraph as stored
# (k-quants and q8_0 copied), then decode at context 128 and a 128-token
# prefill beside llama-bench on the same file. Skipped without llama-bench or
# llama-quantize ($LLAMA_QUANTIZE, else beside llama-bench).
llama_quantize=${LLAMA_QUANTIZE:-$(dirname "$llama_bench")/llama-quantize}
if [[ -x $llama_bench && -x $llama_quantize && -f ${gguf:-} ]]; then
  printf '\n%-34s %12s %12s %9s\n' "quantized files, $lthreads threads" "offgraph" "llama.cpp" "ratio"
  for ft in ${KQUANT_TYPES:-Q4_K_M Q6_K Q8_0}; do
    qg=$work/qwen3-0.6b-$ft.gguf qp=$work/qwen3-0.6b-$ft.ogp
    [[ -f $qg ]] || { "$llama_quantize" "$gguf" "$qg.part" "$ft" >>"$work/llama-quantize.log" 2>&1 && mv "$qg.part" "$qg"; }
    [[ -f $qp || ! -f $qg ]] || "$build/offgraph" export "$qg" -o "$qp" --max-context 4096 2>>"$work/llama-quantize.log"
    if [[ ! -f $qp ]]; then echo "$ft: no file (see $work/llama-quantize.log)"; continue; fi
    oq=$("$build/offgraph" bench -m "$qp" --backend cpu --json --prompt 128 --gen 32)
    qrows=$("$llama_bench" -m "$qg" -t "$lthreads" -o jsonl -p 128 -n 32 -d 0 2>>"$work/llama-bench.log"; "$llama_bench" -m "$qg" -t "$lthreads" -o jsonl -p 0 -n 32 -d 128 2>>"$work/llama-bench.log") || true
    qts() { echo "$qrows" | grep "\"n_prompt\": *$1," | grep "\"n_gen\": *$2," | grep "\"n_depth\": *$3," | grep -o '"avg_ts": *[0-9.e+-]*' | grep -o '[0-9.e+-]*$'; }
    lrow "$ft decode tok/s at context 128" "$(field "$oq" decode_tokens_per_s)" "$(qts 0 32 128)"
    lrow "$ft prefill tok/s, 128 tokens" "$(field "$oq" prefill_tokens_per_s)" "$(qts 128 0 0)"
  done
fi
