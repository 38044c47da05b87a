#!/usr/bin/env bash
# The decode attention checks and timings in two parts that each fit one call
# of ten minutes on the GPU machine, from a folder made by tests/gpu/pack.sh
# (nothing is built here). Logs go to <out-dir> (at most 7 files), a summary
# is printed last.
#   tests/gpu/attend.sh <build-dir> <out-dir> tests
#     test_attend_cuda (every case), then compute-sanitizer memcheck and
#     racecheck over its int8 / fp8 cases at the quick sizes
#     (OG_CUDA_TEST_QUICK=1 OG_ATTEND_CUDA_TEST_QUANT_ONLY=1)
#   tests/gpu/attend.sh <build-dir> <out-dir> bench
#     bench_attend_cuda with programmatic dependent launch allowed, then with
#     OG_CUDA_PDL=0, then test_exec_cuda (the executor's captured decode
#     graphs, whose attention launches may now overlap the kernel before)
#   tests/gpu/attend.sh <build-dir> <out-dir> all   (both, about 15 minutes at most)
set -u
B=$(cd "${1:?usage: tests/gpu/attend.sh <build-dir> <out-dir> tests|bench|all}" && pwd)
OUT=${2:?usage: tests/gpu/attend.sh <build-dir> <out-dir> tests|bench|all}
PART=${3:-all}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. "$(dirname "$0")/step.sh"
if [ "$PART" = tests ] || [ "$PART" = all ]; then
    step test_attend 240 "$B/tests/test_attend_cuda"
    if command -v compute-sanitizer >/dev/null; then
        step memcheck_quant 150 env OG_CUDA_TEST_QUICK=1 OG_ATTEND_CUDA_TEST_QUANT_ONLY=1 \
            compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_attend_cuda"
        step racecheck_quant 200 env OG_CUDA_TEST_QUICK=1 OG_ATTEND_CUDA_TEST_QUANT_ONLY=1 \
            compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_attend_cuda"
    else
        summary+=("compute-sanitizer not found: sanitizer checks not run")
    fi
fi
if [ "$PART" = bench ] || [ "$PART" = all ]; then
    step bench 200 "$B/bench/bench_attend_cuda"
    step bench_nopdl 200 env OG_CUDA_PDL=0 "$B/bench/bench_attend_cuda"
    step test_exec 150 "$B/tests/test_exec_cuda"
fi
for f in "$OUT"/test_attend.log "$OUT"/memcheck_quant.log "$OUT"/racecheck_quant.log "$OUT"/test_exec.log; do
    [ -f "$f" ] && grep -E "FAIL|failed|ERROR SUMMARY|RACECHECK SUMMARY|passed" "$f" | head -8
done
for f in "$OUT"/bench.log "$OUT"/bench_nopdl.log; do
    [ -f "$f" ] && { echo "---- $(basename "$f")"; grep -v '^{' "$f"; }
done
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
