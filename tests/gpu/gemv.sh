#!/usr/bin/env bash
# The split-K bf16 decode products (OG_CUDA_GEMV_SPLIT=1) checked and timed
# in parts that each fit one call of ten minutes on the GPU machine, from a
# folder made by tests/gpu/pack.sh (nothing is built here). Logs go to
# <out-dir> (at most 8 files), a summary is printed last.
#   tests/gpu/gemv.sh <build-dir> <out-dir> tests
#     test_ops_cuda (its split section forces the kernel on; the rest with the
#     default kernels), test_ops_cuda and test_exec_cuda with
#     OG_CUDA_GEMV_SPLIT=1 (every gemv test, the fused forms, captured graphs),
#     compute-sanitizer memcheck and racecheck of test_ops_cuda's split
#     section at the quick sizes (OG_CUDA_TEST_SPLIT_ONLY=1 OG_CUDA_TEST_QUICK=1)
#   tests/gpu/gemv.sh <build-dir> <out-dir> bench
#     bench_gemv_cuda over the 0.6b, 8b and 32b shapes: every bf16 product
#     under the ring kernel, the split kernel and its variants
#   tests/gpu/gemv.sh <build-dir> <out-dir> e2e
#     8B-shaped decode at context 512, ring kernel then split kernel
#     (offgraph bench; the checkpoint made by bench/gpu/peer.py make-qwen3 in
#     $BENCH_WORK, default a temporary folder)
set -u
usage="usage: tests/gpu/gemv.sh <build-dir> <out-dir> tests|bench|e2e"
B=$(cd "${1:?$usage}" && pwd)
OUT=${2:?$usage}
PART=${3:?$usage}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. "$(dirname "$0")/step.sh"
case $PART in
tests)
    step test_ops 200 "$B/tests/test_ops_cuda"
    step test_ops_split 150 env OG_CUDA_GEMV_SPLIT=1 "$B/tests/test_ops_cuda"
    step test_exec_split 100 env OG_CUDA_GEMV_SPLIT=1 "$B/tests/test_exec_cuda"
    if command -v compute-sanitizer >/dev/null; then
        step memcheck_split 120 env OG_CUDA_TEST_QUICK=1 OG_CUDA_TEST_SPLIT_ONLY=1 \
            compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_ops_cuda"
        step racecheck_split 150 env OG_CUDA_TEST_QUICK=1 OG_CUDA_TEST_SPLIT_ONLY=1 \
            compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_ops_cuda"
    else
        summary+=("compute-sanitizer not found: sanitizer checks not run")
    fi
    for f in "$OUT"/*.log; do
        echo "---- $(basename "$f")"
        grep -E "FAIL|failed|ERROR SUMMARY|RACECHECK SUMMARY|passed|split" "$f" | head -8
    done
    ;;
bench)
    step bench 500 "$B/bench/bench_gemv_cuda"
    sed -n '/^---- bf16: ring kernel -> split kernel/,$p' "$OUT/bench.log"
    grep -E '"weights":"bf16"' "$OUT/bench.log" | grep -E '"kernel":"split[0-9_r]' >/dev/null &&
        echo "(the split1/split2/split4/split_r32 rows of $OUT/bench.log: the policy's alternatives)"
    ;;
e2e)
    W=${BENCH_WORK:-$(mktemp -d)}
    [ -f "$W/qwen3-8b/config.json" ] || step make_8b 300 python3 "$SRC/bench/gpu/peer.py" make-qwen3 "$W/qwen3-8b" 8b
    [ -f "$W/qwen3-8b.ogp" ] || step export_8b 200 "$B/offgraph" export "$W/qwen3-8b" -o "$W/qwen3-8b.ogp" --max-context 1024
    step e2e_ring 120 env OG_CUDA_GEMV_SPLIT=0 "$B/offgraph" bench -m "$W/qwen3-8b.ogp" --backend cuda --prompt 512 --gen 256 --json
    step e2e_split 120 env OG_CUDA_GEMV_SPLIT=1 "$B/offgraph" bench -m "$W/qwen3-8b.ogp" --backend cuda --prompt 512 --gen 256 --json
    for f in "$OUT"/e2e_ring.log "$OUT"/e2e_split.log; do echo "---- $(basename "$f")"; grep '^{' "$f"; done
    ;;
*) echo "$usage" >&2; exit 2 ;;
esac
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
