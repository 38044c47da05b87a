#!/usr/bin/env bash
# Everything a GPU machine should run for a change to the CUDA code, in one
# command of about ten minutes, from a folder made by tests/gpu/pack.sh
# (nothing of offgraph is built here). Meant for a machine lent for a short
# time: what finishes is written as it finishes, so a run cut off at its
# time limit still leaves every figure and check that got done.
#   bench/gpu/oneshot.sh <build-dir> [old-build-dir]
# Side by side from the start:
#   - tests/gpu/run.sh in six groups of checks (one RESULTS_DIR each; the
#     kernel tests of the k-quants and the parity checks first), each given
#     TESTS_S seconds (default 270);
#   - llama.cpp's llama-bench and llama-quantize built with CUDA from the
#     source tree LLAMA_SRC (optional; LLAMA_DIR, default build-llama-cuda
#     under the source root, is reused when it already holds them);
#   - the 8B shape (peer.py make-qwen3, random bf16 weights) in WORK
#     (default build-m under the source root; kept, so a second run reuses
#     it), its Q4_K_M program (offgraph export --weights q4_k_m) and, with
#     llama.cpp's gguf-py, its bf16 GGUF (bench/make_gguf.py).
# Then, on a quiet GPU: offgraph's decode of the Q4_K_M program at contexts
# 512 and 4096; llama-quantize's Q4_K_M of the bf16 GGUF, llama-bench on it
# (decode at depth 512 and 4096, flash attention on) and offgraph on the
# very same file (export of the GGUF, then bench); bench_kquant_cuda q4_k and
# q6_k of the old build and this one; an Nsight Compute profile of the
# streamed k-quant gemv on the down product (NCU_BIN, default ncu on the path
# or in /usr/local/cuda/bin).
# Results in RESULTS_DIR (default <build-dir>/oneshot): log.txt (the run,
# with times), tests.txt (one line a check) and fails.txt (the log of each
# failed check), e2e.txt (the decode figures, offgraph's bench JSON and
# llama-bench's JSON lines), kquant.txt, ncu.txt.
# DEADLINE (seconds, default 590): no new stage starts that would not end
# before it.
set -u
B=$(cd "${1:?usage: bench/gpu/oneshot.sh <build-dir> [old-build-dir]}" && pwd)
OLD=${2:+$(cd "$2" && pwd)}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
RES=${RESULTS_DIR:-$B/oneshot}
WORK=${WORK:-$SRC/build-m}
LLAMA_DIR=${LLAMA_DIR:-$SRC/build-llama-cuda}
LLAMA_SRC=${LLAMA_SRC:-}
DEADLINE=${DEADLINE:-590}
mkdir -p "$RES" "$WORK"
L=$RES/log.txt
T0=$SECONDS
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$L"; }
left() { echo $((DEADLINE - (SECONDS - T0))); }
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >>"$L" 2>&1
LB=$LLAMA_DIR/bin

# llama.cpp, on the CPU while the checks run
lpid=
if [ ! -x "$LB/llama-bench" ] && [ -n "$LLAMA_SRC" ]; then
    log "building llama.cpp from $LLAMA_SRC into $LLAMA_DIR"
    (
        gen=()
        command -v ninja >/dev/null && gen=(-G Ninja)
        [ -f "$LLAMA_DIR/CMakeCache.txt" ] ||
            cmake -S "$LLAMA_SRC" -B "$LLAMA_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
                -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        nice -n 5 cmake --build "$LLAMA_DIR" -j"$(($(nproc) > 3 ? $(nproc) - 3 : 1))" --target llama-bench llama-quantize
    ) >"$RES/llama-build.log" 2>&1 &
    lpid=$!
fi
GGUF_PY=$LLAMA_DIR/gguf-py
[ -d "$GGUF_PY" ] || GGUF_PY=${LLAMA_SRC:+$LLAMA_SRC/gguf-py}

# the model, on the CPU too
(
    [ -f "$WORK/hf/config.json" ] || python3 "$SRC/bench/gpu/peer.py" make-qwen3 "$WORK/hf" 8b || exit 1
    if [ ! -f "$WORK/q4_k_m.ogp" ]; then
        "$B/offgraph" export "$WORK/hf" -o "$WORK/q4_k_m.ogp.part" --weights q4_k_m --max-context 8192 &&
            mv "$WORK/q4_k_m.ogp.part" "$WORK/q4_k_m.ogp"
    fi &
    if [ ! -f "$WORK/bf16.gguf" ] && [ -n "$GGUF_PY" ] && [ -d "$GGUF_PY" ]; then
        PYTHONPATH=$GGUF_PY python3 "$SRC/bench/make_gguf.py" "$WORK/hf" "$WORK/bf16.gguf.part" &&
            mv "$WORK/bf16.gguf.part" "$WORK/bf16.gguf"
    fi
    wait
) >"$RES/model.log" 2>&1 &
mpid=$!

# the checks, in six groups side by side
groups=('test_kquant_cuda|parity.*|hybrid_cuda|nccl_tp1'
    'test_(ops|attend|sample|mask|moe|gpu_kv|exec|fork|gdn).*|threads.*|profile_cuda'
    'memcheck_(ops|split|narrow|attend|sample|mask|moe)'
    'memcheck_(exec|fork|kquant|gdn|kv_alloc)'
    'racecheck_.*|synccheck_sample'
    'serve_faults_cuda')
pids=()
for i in "${!groups[@]}"; do
    mkdir -p "$RES/g$i"
    OG_GPU_CHECKS=${groups[$i]} RESULTS_DIR=$RES/g$i timeout -k 5 "${TESTS_S:-270}" \
        bash "$SRC/tests/gpu/run.sh" "$B" >"$RES/g$i/lines.txt" 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
# a group cut off by its time leaves its check's process behind
pkill -f "$B/tests/" 2>/dev/null
pkill -f compute-sanitizer 2>/dev/null
# one line a check (run.sh prints each as it ends, then all again)
cat "$RES"/g*/lines.txt | grep -E '^[a-z0-9_]+ +(ok|skipped|FAIL)' | sort -u >"$RES/tests.txt"
: >"$RES/fails.txt"
for i in "${!groups[@]}"; do
    grep -E '^[a-z0-9_]+ +FAIL' "$RES/g$i/lines.txt" | sort -u | while read -r name _; do
        awk -v n="$name" '/^==== / { p = ($2 == n ":") } p' "$RES/g$i/gpu-tests.log" | tail -80 >>"$RES/fails.txt"
    done
done
log "checks: $(grep -c ' ok ' "$RES/tests.txt") ok, $(grep -c FAIL "$RES/tests.txt") failed, $(grep -c skipped "$RES/tests.txt") skipped"

E=$RES/e2e.txt
bench() { # <program> <context>: offgraph's decode JSON
    timeout 120 "$B/offgraph" bench -m "$1" --backend cuda --prompt "$2" --gen 256 --json 2>>"$RES/bench.err"
}
while kill -0 "$mpid" 2>/dev/null && [ "$(left)" -gt 200 ]; do sleep 2; done
tail -3 "$RES/model.log" >>"$L"
if [ -f "$WORK/q4_k_m.ogp" ]; then
    for ctx in 512 4096; do
        [ "$(left)" -gt 150 ] && echo "offgraph q4_k_m (export) context $ctx $(bench "$WORK/q4_k_m.ogp" $ctx)" >>"$E"
    done
    log "offgraph decode done"
fi
if [ -n "$lpid" ]; then
    while kill -0 "$lpid" 2>/dev/null && [ "$(left)" -gt 150 ]; do sleep 2; done
    tail -2 "$RES/llama-build.log" >>"$L"
fi
if [ -x "$LB/llama-quantize" ] && [ -f "$WORK/bf16.gguf" ] && [ ! -f "$WORK/Q4_K_M.gguf" ] && [ "$(left)" -gt 120 ]; then
    log "llama-quantize Q4_K_M"
    timeout $(($(left) - 90)) "$LB/llama-quantize" "$WORK/bf16.gguf" "$WORK/Q4_K_M.gguf.part" Q4_K_M "$(nproc)" \
        >"$RES/quantize.log" 2>&1 && mv "$WORK/Q4_K_M.gguf.part" "$WORK/Q4_K_M.gguf"
fi
if [ -x "$LB/llama-bench" ] && [ -f "$WORK/Q4_K_M.gguf" ] && [ "$(left)" -gt 60 ]; then
    log "llama-bench, then offgraph on the same file"
    timeout 60 "$LB/llama-bench" -m "$WORK/Q4_K_M.gguf" -ngl 99 -fa on -p 0 -n 128 -d 512,4096 -o jsonl >>"$E" 2>>"$RES/bench.err"
    [ -f "$WORK/gguf.ogp" ] || timeout 60 "$B/offgraph" export "$WORK/Q4_K_M.gguf" -o "$WORK/gguf.ogp" --max-context 8192 >>"$E" 2>&1
    [ -f "$WORK/gguf.ogp" ] && [ "$(left)" -gt 40 ] && echo "offgraph Q4_K_M.gguf context 512 $(bench "$WORK/gguf.ogp" 512)" >>"$E"
fi
if [ "$(left)" -gt 40 ]; then
    log "bench_kquant_cuda"
    for dt in q4_k q6_k; do
        for b in ${OLD:+"$OLD"} "$B"; do
            echo "== $b $dt"
            timeout 15 "$b/bench/bench_kquant_cuda" "$dt" 2>&1 | tail -30
        done
    done >"$RES/kquant.txt"
fi
NCU_BIN=${NCU_BIN:-$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)}
if [ -n "$NCU_BIN" ] && [ "$(left)" -gt 30 ]; then
    log "ncu"
    timeout $(($(left) - 8)) "$NCU_BIN" --clock-control none --set full -k regex:gemv_stream --launch-skip 20 -c 1 \
        "$B/bench/bench_kquant_cuda" q4_k down >"$RES/ncu.txt" 2>&1
fi
log "end"
