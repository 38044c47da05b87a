#!/usr/bin/env bash
# Quantized formats side by side, in one run: accuracy on the demo model and
# decode speed of the Qwen3-0.6B shape, for every weight format (bf16, q8,
# q4) and KV format (bf16, int8, fp8).
#
#   bash bench/quant.sh [build-dir] [scratch-dir] [cpu|cuda]
#   CONTEXTS="128 4096 32768" picks the decode contexts (default: 128 4096 on
#   the CPU, 128 4096 32768 on CUDA); SKIP_ACCURACY=1 runs the speed part only.
#
# 1. Accuracy (CPU): the demo model (models/kjv-tiny) on text it never trained
#    on, the Book of Revelation (the training script held out the last 2 % of
#    the KJV; Revelation lies inside it), as Debian's bible-kjv prints it
#    (installed when missing and we are root; the section is skipped with a
#    message otherwise), cleaned as scripts/train_demo_model.py cleans its
#    text. offgraph perplexity --ctx 512 for each format; top-1 agreement is
#    the fraction of scored positions whose most likely next token equals the
#    bf16 / bf16 run's.
# 2. Speed: a Qwen3-0.6B-shaped checkpoint (28 layers, hidden 1024, vocab
#    151936, tied; tests/fixtures/make_synthetic_checkpoints.py, needs
#    python3-numpy) exported with each weight format; offgraph bench decode
#    tok/s at contexts 128 and 4096 on the chosen backend, each against its
#    bytes floor: (weight bytes + the KV bytes a token reads) over the copy
#    rate bench_copy measures (CPU) or 4.2 TB/s (the H200's measured
#    device-to-device copy, bench/gpu/run.sh) on CUDA.
set -euo pipefail
build=${1:-build}
work=${2:-${TMPDIR:-/tmp}/offgraph-quant}
backend=${3:-cpu}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$build/offgraph
mkdir -p "$work"
if [ "$backend" = cuda ]; then contexts=${CONTEXTS:-128 4096 32768}; else contexts=${CONTEXTS:-128 4096}; fi
maxctx=$(echo $contexts | tr ' ' '\n' | sort -n | tail -1)
field() { echo "$1" | grep -o "\"$2\": *[0-9.e+-]*" | head -1 | sed 's/.*: *//'; }
kv_ok() { # does this build take --kv-dtype $1? (its --help lists the dtypes)
  "$bin" bench --help | grep -- '--kv-dtype' | grep -qw "$1"
}
kvs="bf16"
for k in int8 fp8; do kv_ok "$k" && kvs="$kvs $k" || echo "kv $k: not supported by this build, left out" >&2; done

# ---- 1. accuracy
text=$work/revelation.txt
if ! command -v bible >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bible-kjv >&2 || true
fi
if [ -n "${SKIP_ACCURACY:-}" ]; then
  echo "accuracy: skipped (SKIP_ACCURACY)" >&2
elif command -v bible >/dev/null; then
  # one paragraph per chapter, verse numbers dropped (train_demo_model.py's clean())
  bible "Revelation 1:1-22:21" | awk '
    /^[^ ].* [0-9]+$/ { if (p != "") print p; p = ""; next }
    { sub(/^ +/, ""); sub(/ +$/, ""); if ($0 == "") next; sub(/^[0-9]+ /, ""); p = p == "" ? $0 : p " " $0 }
    END { if (p != "") print p }' >"$text"
  demo=$root/models/kjv-tiny
  for w in bf16 q8 q4; do
    [ -f "$work/kjv-$w.ogp" ] || "$bin" export "$demo" -o "$work/kjv-$w.ogp" --weights "$w" 2>>"$work/export.log"
  done
  printf '\n---- accuracy: demo model, Revelation (%s words, held out), perplexity --ctx 512\n' "$(wc -w <"$text")"
  printf '%-8s %-6s %12s %10s %10s %12s\n' weights kv perplexity "vs bf16" "top-1 acc" "top-1 agree"
  base_ppl=
  for w in bf16 q8 q4; do
    for k in $kvs; do
      out=$("$bin" perplexity -m "$work/kjv-$w.ogp" -f "$text" --ctx 512 --kv-dtype "$k" --backend cpu --json \
            --top1 "$work/top1.$w.$k" 2>/dev/null)
      ppl=$(field "$out" perplexity)
      [ -z "$base_ppl" ] && base_ppl=$ppl
      agree=$(paste -d' ' "$work/top1.bf16.bf16" "$work/top1.$w.$k" | awk '{ n++; s += $1 == $2 } END { printf "%.4f", s / n }')
      printf '%-8s %-6s %12.3f %+9.2f%% %10.4f %12s\n' "$w" "$k" "$ppl" \
        "$(awk -v a="$ppl" -v b="$base_ppl" 'BEGIN { print 100 * (a / b - 1) }')" "$(field "$out" top1_accuracy)" "$agree"
    done
  done
else
  echo "accuracy: skipped (no 'bible' command: apt-get install bible-kjv)" >&2
fi

# ---- 2. speed
if [[ ! -d $work/hf ]]; then
  echo "making a Qwen3-0.6B-shaped checkpoint in $work/hf" >&2
  "${PYTHON:-/usr/bin/python3}" "$root/tests/fixtures/make_synthetic_checkpoints.py" --qwen3-0.6b "$work/hf"
fi
if [ "$backend" = cuda ]; then
  copy=4200
else
  copy=$("$build/bench/bench_copy" | grep -o '[0-9.]* GB/s' | grep -o '^[0-9.]*')
fi
printf '\n---- decode speed: Qwen3-0.6B shape, %s backend, floor at %s GB/s\n' "$backend" "$copy"
printf '%-8s %-6s %8s %10s %10s %7s %10s\n' weights kv context "tok/s" floor "of it" "vs bf16/bf16"
declare -A base
for w in bf16 q8 q4; do
  p=$work/qwen3-0.6b-$w-$maxctx.ogp
  [ -f "$p" ] || "$bin" export "$work/hf" -o "$p" --weights "$w" --max-context $((maxctx > 8192 ? maxctx : 8192)) \
    --force-max-context 2>>"$work/export.log"
  wbytes=$("$bin" inspect "$p" | sed -n 's/^weights: .* parameters, \([0-9]*\) bytes.*/\1/p')
  for k in $kvs; do
    case $k in bf16) kvb=2 ;; *) kvb=1 ;; esac
    for ctx in $contexts; do
      # decode from ctx - 32 + 1 on: inside the capacity the prompt grew the layers to
      out=$("$bin" bench -m "$p" --backend "$backend" --kv-dtype "$k" --prompt $((ctx - 33)) --gen 32 --json 2>/dev/null)
      d=$(field "$out" decode_tokens_per_s)
      # KV a token reads: 28 layers x (k + v) x 8 heads x 128 x bytes (+ a 4-byte scale per head for int8/fp8)
      kvt=$(awk -v b=$kvb 'BEGIN { print 28 * 2 * 8 * (128 * b + (b == 1 ? 4 : 0)) }')
      f=$(awk -v c="$copy" -v w="$wbytes" -v k="$kvt" -v n="$ctx" 'BEGIN { printf "%.1f", c * 1e9 / (w + k * n) }')
      key=$ctx # every format against bf16 weights with bf16 KV at the same context
      [ "$w" = bf16 ] && [ "$k" = bf16 ] && base[$key]=$d
      printf '%-8s %-6s %8d %10.1f %10s %6.0f%% %9.2fx\n' "$w" "$k" "$ctx" "$d" "$f" \
        "$(awk -v a="$d" -v b="$f" 'BEGIN { print 100 * a / b }')" "$(awk -v a="$d" -v b="${base[$key]}" 'BEGIN { print a / b }')"
    done
  done
done
