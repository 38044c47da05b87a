#!/usr/bin/env bash
# The MoE grouped GEMM on the tensor cores (src/kernels/cuda/moe.cu,
# OG_CUDA_MOE_GEMM=1) on the GPU machine, in one call of under ten minutes
# (the steps' time limits add up to 570 s),
# from a folder made by tests/gpu/pack.sh (nothing is built here). Logs go to
# <out-dir>, a summary is printed last.
#   tests/gpu/moe_gemm.sh <build-dir> <out-dir>
#   1. test_moe_cuda: every case, the section "the grouped GEMM on the tensor
#      cores" included (the kernel against og_moe_ref at 1 / 7 / 64 / 300
#      tokens, uneven expert loads, odd K and N);
#   2. compute-sanitizer memcheck and racecheck over it (quick sizes);
#   3. bench_moe_cuda: the 30B-A3B expert layer's prefill of 512 and 4096
#      tokens, CUDA cores against tensor cores, ms and TFLOP/s;
#   4. the MoE fixtures' transformers parity with --backend cuda and the GEMM
#      on (tests/cli_parity.sh, OG_PARITY_ONLY='qwen3-moe*': the bf16
#      programs' prefill chunks take it where a step has 64 pairs or more).
set -u
B=$(cd "${1:?usage: tests/gpu/moe_gemm.sh <build-dir> <out-dir>}" && pwd)
OUT=${2:?usage: tests/gpu/moe_gemm.sh <build-dir> <out-dir>}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OG_SOURCE_DIR=$SRC
. "$(dirname "$0")/step.sh"
step test_moe_cuda 90 "$B/tests/test_moe_cuda"
if command -v compute-sanitizer >/dev/null; then
    step memcheck_moe 120 env OG_CUDA_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_moe_cuda"
    step racecheck_moe 120 env OG_CUDA_TEST_QUICK=1 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_moe_cuda"
else
    summary+=("compute-sanitizer not found: memcheck / racecheck not run")
fi
step bench_moe_cuda 120 "$B/bench/bench_moe_cuda"
step parity_moe_gemm 120 env OG_BACKEND=cuda OG_CUDA_MOE_GEMM=1 OG_PARITY_ONLY='qwen3-moe*' \
    bash "$SRC/tests/cli_parity.sh" "$B/offgraph" "$(mktemp -d)"
grep -E "failed|FAIL|passed|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT"/test_moe_cuda.log "$OUT"/memcheck_moe.log \
    "$OUT"/racecheck_moe.log 2>/dev/null | head -20
grep -A 5 "^moe layer prefill" "$OUT/bench_moe_cuda.log"
tail -3 "$OUT/parity_moe_gemm.log"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
