#!/usr/bin/env bash
# The k-quant checks and timings on the GPU machine, in parts that each fit
# one call of ten minutes, from a folder made by tests/gpu/pack.sh (nothing
# is built here). Logs go to <out-dir>, a summary is printed last.
#   tests/gpu/kquant.sh <build-dir> <out-dir> tests
#     test_kquant_cuda (the kernels against the C references, the CUDA back
#     end on q4_k_m / q5_k_m / q2_k / q3_k programs against the CPU's), then
#     compute-sanitizer memcheck over it
#   tests/gpu/kquant.sh <build-dir> <out-dir> bench06 | bench8
#     bench/gpu/run.sh for the Qwen3 0.6B (contexts 128 4096) or 8B
#     (contexts 512 4096) shape with WEIGHTS (default "q4_k_m q6_k"): offgraph
#     exports the random checkpoint with each mix (the bytes llama-quantize
#     writes for it), and llama-bench runs llama-quantize's file of the same
#     checkpoint; decode tok/s at each context and prefill of a context-long
#     prompt, side by side. Needs LLAMA_BENCH / LLAMA_DIR as bench/gpu/run.sh
#     does; its results (bench.jsonl, bench.log) and the table go to <out-dir>.
set -u
B=$(cd "${1:?usage: tests/gpu/kquant.sh <build-dir> <out-dir> tests|bench06|bench8}" && pwd)
OUT=${2:?usage: tests/gpu/kquant.sh <build-dir> <out-dir> tests|bench06|bench8}
PART=${3:-tests}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. "$(dirname "$0")/step.sh"
case $PART in
tests)
    step test_kquant_cuda 240 "$B/tests/test_kquant_cuda"
    if command -v compute-sanitizer >/dev/null; then
        step memcheck_kquant 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_kquant_cuda"
    else
        summary+=("compute-sanitizer not found: memcheck not run")
    fi
    for f in "$OUT"/test_kquant_cuda.log "$OUT"/memcheck_kquant.log; do
        [ -f "$f" ] && grep -E "failed|max \|logit|ERROR SUMMARY|passed" "$f" | head -12
    done
    ;;
bench06 | bench8)
    shape=0.6b
    [ "$PART" = bench8 ] && shape=8b
    step bench_$shape 590 env RESULTS_DIR="$OUT" SHAPES=$shape WEIGHTS="${WEIGHTS:-q4_k_m q6_k}" \
        CONTEXTS_0_6B="${CONTEXTS_0_6B:-128 4096}" CONTEXTS_8B="${CONTEXTS_8B:-512 4096}" ATTEND=0 GEMV=0 BATCH=0 TRANSFORMERS=0 \
        bash "$SRC/bench/gpu/run.sh" "$B"
    grep -A 12 -- "---- end to end" "$OUT/bench_$shape.log"
    ;;
*)
    echo "unknown part $PART (tests, bench06, bench8)"
    exit 2
    ;;
esac
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
