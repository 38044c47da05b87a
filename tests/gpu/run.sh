#!/usr/bin/env bash
# Every GPU check in one command, from a folder made by tests/gpu/pack.sh
# (nothing is built here). Prints one line per check and a summary last; the
# full output goes to $RESULTS_DIR/gpu-tests.log (default <build-dir>/results).
#   1. kernel tests against the C references (test_ops_cuda, also with the
#      CUDA-core gemv and with the split-K bf16 gemv (OG_CUDA_GEMV_SPLIT=1), test_attend_cuda,
#      test_sample_cuda: the device sampler against og_sampler_sample, a
#      row read by a cluster of blocks and (test_sample_cuda_block) by one;
#      test_mask_cuda: grammar masks on batch items applied on the device,
#      against a naive oracle, changing between replays of one graph;
#      test_moe_cuda: the mixture-of-experts layer against og_moe_ref)
#      test_kquant_cuda: the k-quant kernels, and the back end on k-quant
#      programs against the CPU's; profile_cuda: OG_CUDA_PROFILE's tables
#      against the program they profile)
#   2. KV storage on the device, growth by copy and in place (test_gpu_kv_alloc);
#      the CUDA executor: CPU agreement, graphs vs no graphs, one capture per
#      kind across growth (test_exec_cuda; test_exec_cuda_prepare and
#      threads_cuda_prepare with every batch prepared on the host threads)
#   3. parity with the transformers fixtures, every chunking, --backend cuda;
#      the hybrid model (test_gdn_cuda: the Gated DeltaNet kernels against the
#      C references; test_hybrid cuda: forks, checkpoints, saves, prefix hits,
#      batches of a hybrid model on the device; cli_parity_hybrid.sh);
#      offgraph serve under device KV allocation faults (tests/cli_serve_faults.sh);
#      tensor parallel's NCCL path at N = 1 against the plain path (tests/gpu/nccl_tp1.sh)
#   4. compute-sanitizer memcheck and racecheck on the kernel tests (quick sizes),
#      memcheck on the narrow products alone (their clusters),
#      synccheck on the sampler's cluster barriers,
#      memcheck on the executor and on KV storage growing in place;
#      OG_GPU_SANITIZERS=0 leaves them out (run them later, or not at all)
# A check that exits 77 (no device) is reported as skipped.
# OG_GPU_CHECKS: an extended regular expression of check names; only the
# checks it matches whole run (several such runs side by side, each with its
# own RESULTS_DIR, fit all of them into a shorter time on one GPU).
set -u
B=$(cd "${1:?usage: tests/gpu/run.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
RES=${RESULTS_DIR:-$B/results}
mkdir -p "$RES"
LOG=$RES/gpu-tests.log
: >"$LOG"
export OG_SOURCE_DIR=$SRC
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
summary=()
fails=0
check() {
    local name=$1
    shift
    [ -n "${OG_GPU_CHECKS:-}" ] && ! [[ $name =~ ^(${OG_GPU_CHECKS})$ ]] && return 0
    local t0=$SECONDS
    echo "==== $name: $*" >>"$LOG"
    "$@" >>"$LOG" 2>&1
    local rc=$? state
    case $rc in 0) state=ok ;; 77) state=skipped ;; *) state="FAIL (rc $rc)"; fails=$((fails + 1)) ;; esac
    local line
    line=$(printf '%-28s %-12s %4ds' "$name" "$state" $((SECONDS - t0)))
    echo "$line"
    summary+=("$line")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
check test_ops_cuda "$B/tests/test_ops_cuda"
# the CUDA-core decode products, which the tensor-core ones replace where they fit
check test_ops_cuda_cores env OG_CUDA_GEMV=cores "$B/tests/test_ops_cuda"
# the split-K bf16 products (off by default) under every gemv test, the fused and graph-captured ones included
check test_ops_cuda_split env OG_CUDA_GEMV_SPLIT=1 "$B/tests/test_ops_cuda"
check test_exec_cuda_split env OG_CUDA_GEMV_SPLIT=1 "$B/tests/test_exec_cuda"
check test_attend_cuda "$B/tests/test_attend_cuda"
check test_sample_cuda "$B/tests/test_sample_cuda"
check test_sample_cuda_block env OG_CUDA_SAMPLE_CLUSTER=1 "$B/tests/test_sample_cuda"
check test_mask_cuda "$B/tests/test_mask_cuda"
check test_moe_cuda "$B/tests/test_moe_cuda"
check test_gpu_kv_alloc "$B/tests/test_gpu_kv_alloc"
check test_exec_cuda "$B/tests/test_exec_cuda"
# every step of two or more sessions prepared on the model's host threads
check test_exec_cuda_prepare env OG_PREPARE_PARALLEL=2 "$B/tests/test_exec_cuda"
check threads_cuda_prepare env OG_PREPARE_PARALLEL=2 "$B/tests/test_threads" cuda
check test_fork_cuda "$B/tests/test_fork_cuda"
check test_kquant_cuda "$B/tests/test_kquant_cuda"
# OG_CUDA_PROFILE's tables against the program: launches a step per layer, the head once, shares summing to 100 %
check profile_cuda bash "$SRC/tests/gpu/profile_check.sh" "$B"
check threads_cuda "$B/tests/test_threads" cuda
check parity_cuda env OG_BACKEND=cuda bash "$SRC/tests/cli_parity.sh" "$B/offgraph" "$(mktemp -d)"
check test_gdn_cuda "$B/tests/test_gdn_cuda"
check hybrid_cuda "$B/tests/test_hybrid" cuda
check parity_hybrid_cuda env OG_BACKEND=cuda bash "$SRC/tests/cli_parity_hybrid.sh" "$B/offgraph" "$(mktemp -d)"
# tensor parallel's NCCL path at N = 1: its all-reduces, inside the decode graphs, change no bit
check nccl_tp1 bash "$SRC/tests/gpu/nccl_tp1.sh" "$B"
# offgraph serve with device KV allocations failing (cuMemCreate, cudaMallocAsync): each fault fails
# its request alone. The checkpoint has kjv-tiny's tokenizer and wide KV rows (8 KiB a token and
# layer in f32) and no sliding layers, so that every request starts from a fork of a cached prompt
# and outgrows several 2 MiB chunks: kjv-tiny's own rows fit a whole request into the first chunk,
# which a server's pooled sessions keep, and its rings kept the prefix cache from forking, so
# faults were rare. Blocks grow by one granule here (OG_CUDA_KV_GRANULES=1, not the default 4):
# a request of 600 tokens fits an 8 MiB growth whole, and 34 faults came in 400 s against 100
WIDE=$(mktemp -d)
python3 "$SRC/tests/serve/wide_kv_model.py" "$SRC/models/kjv-tiny" "$WIDE/wide" >>"$LOG" 2>&1
check serve_faults_cuda env OG_BACKEND=cuda OG_CUDA_KV_GRANULES=1 OG_FAULTS_TEXT=length OG_FAULTS_MODEL="$WIDE/wide" OG_FAULTS_EVERY=16 \
    OG_FAULTS_TOKENS="300 450 600" OG_FAULTS_ARGS="--kv-dtype f32" OG_FAULTS_KV_BUDGET=512M \
    bash "$SRC/tests/cli_serve_faults.sh" "$B/offgraph" "$(mktemp -d)"
rm -rf "$WIDE"
if [ "${OG_GPU_SANITIZERS:-1}" = 0 ]; then
    echo "OG_GPU_SANITIZERS=0: sanitizer checks not run" | tee -a "$LOG"
elif command -v compute-sanitizer >/dev/null; then
    export OG_CUDA_TEST_QUICK=1
    check memcheck_ops compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_ops_cuda"
    check memcheck_split env OG_CUDA_TEST_SPLIT_ONLY=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_ops_cuda"
    check racecheck_split env OG_CUDA_TEST_SPLIT_ONLY=1 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_ops_cuda"
    check memcheck_narrow env OG_CUDA_TEST_NARROW_ONLY=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_ops_cuda"
    check memcheck_attend compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_attend_cuda"
    check racecheck_attend compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_attend_cuda"
    check memcheck_sample compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_sample_cuda"
    check memcheck_mask compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_mask_cuda"
    check memcheck_moe compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_moe_cuda"
    check racecheck_moe compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_moe_cuda"
    # racecheck (2025.3) stops with "failed to handle a hardware exception" on the sampler's
    # cluster launches at every cluster size, while memcheck, synccheck and plain runs of the same
    # launches are clean: it checks a row read by one block, whose shared-memory code every block
    # of a cluster runs; the cluster's exchanges are ordered by its barriers (synccheck_sample)
    check racecheck_sample env OG_CUDA_SAMPLE_CLUSTER=1 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_sample_cuda"
    check synccheck_sample compute-sanitizer --tool synccheck --error-exitcode 9 "$B/tests/test_sample_cuda"
    check memcheck_exec compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_exec_cuda"
    check memcheck_fork compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_fork_cuda"
    check memcheck_kquant compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_kquant_cuda"
    # the streamed k-quant gemv writes x's terms (and the norm's sums) into each block's shared memory
    check racecheck_kquant compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_kquant_cuda"
    check memcheck_gdn compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_gdn_cuda"
    check racecheck_gdn compute-sanitizer --tool racecheck --error-exitcode 9 "$B/tests/test_gdn_cuda"
    # the test provokes out-of-memory on purpose: API errors are expected there
    check memcheck_kv_alloc compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$B/tests/test_gpu_kv_alloc"
    unset OG_CUDA_TEST_QUICK
else
    echo "compute-sanitizer not found: sanitizer checks not run" | tee -a "$LOG"
fi
grep -E "FAIL|failed:|CHECK\(" "$LOG" | head -20
echo "---- GPU tests: $((${#summary[@]} - fails)) of ${#summary[@]} passed or skipped; log: $LOG"
printf '%s\n' "${summary[@]}"
[ "$fails" -eq 0 ]
