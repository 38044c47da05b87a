#!/usr/bin/env bash
# GPU benchmarks side by side with their peers, in one run, from a folder made
# by tests/gpu/pack.sh. Needs python3 with torch and transformers. Prints a
# table last; JSON lines go to $RESULTS_DIR/bench.jsonl (default <build-dir>/results).
#   1. decode attention, Hq=32 Hkv=8 D=128 bf16, histories 4k/32k/128k:
#      offgraph (bench_attend_cuda) and torch SDPA enable_gqa=True; KV bytes per
#      second as a fraction of a device-to-device copy measured in the same run.
#   2. the decode products (bench_gemv_cuda): every product of the 0.6B, 8B and
#      a 32B-like shape, bf16 / q8 / q4, 1-8 rows, as a fraction of the copy rate;
#      the k-quant ones of the 8B shape (bench_kquant_cuda: q4_k / q5_k / q6_k,
#      the f32-x and the integer gemv; KQUANT=0 leaves it out); the MoE layer's
#      prefill at the Qwen3-30B-A3B expert shape, CUDA cores against the grouped
#      GEMM on the tensor cores (bench_moe_cuda; MOE=0 leaves it out).
#   3. end-to-end decode tokens/s of each shape in SHAPES (default "0.6b 8b";
#      random bf16 weights made by peer.py make-qwen3) at its contexts (0.6b:
#      CONTEXTS_0_6B, default 128 4096 32768; 8b: CONTEXTS_8B, default 512 4096)
#      for each weight format in WEIGHTS (default "bf16 q8 q4 q4_k_m q6_k":
#      offgraph export --weights; the k-quant mixes give the bytes llama-quantize
#      writes for the same checkpoint, so both sides run the very same weights),
#      beside transformers generate with a static cache (bf16) and
#      llama.cpp's llama-bench (CUDA, flash attention on) on a GGUF of the same
#      weights (bf16, and q8_0 / q4_0 / Q4_K_M / Q6_K by llama-quantize where it
#      is given), with
#      the bytes floor of every format (weights read once plus the KV of the
#      context, at the copy rate) and each figure's fraction of it.
#   4. prefill tokens/s of a prompt of each 0.6b context's length, offgraph and llama.cpp.
#   llama.cpp: $LLAMA_BENCH, else build-llama-cuda/bin/llama-bench under the
#   source root; $LLAMA_QUANTIZE (default beside llama-bench) for the q8_0 /
#   q4_0 files; the GGUF is written by bench/make_gguf.py with the gguf Python
#   package ($LLAMA_DIR/gguf-py, default build-llama-cuda/gguf-py, or installed).
#   Without them their rows are skipped with a line saying so (README, "Speed").
#   5. aggregate decode of K sessions in one batched step at context 512, against
#      transformers batched generate (bench/gpu/batch.sh; its table comes last;
#      BATCH=0 leaves it out).
set -u
B=$(cd "${1:?usage: bench/gpu/run.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
RES=${RESULTS_DIR:-$B/results}
mkdir -p "$RES"
J=$RES/bench.jsonl
LOG=$RES/bench.log
: >"$J"
: >"$LOG"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
PEER="python3 $SRC/bench/gpu/peer.py"
WORK=${BENCH_WORK:-$(mktemp -d)}
SHAPES=${SHAPES:-0.6b 8b}
WEIGHTS=${WEIGHTS:-bf16 q8 q4 q4_k_m q6_k}
LLAMA_DIR=${LLAMA_DIR:-$SRC/build-llama-cuda}
LLAMA_BENCH=${LLAMA_BENCH:-$LLAMA_DIR/bin/llama-bench}
LLAMA_QUANTIZE=${LLAMA_QUANTIZE:-$(dirname "$LLAMA_BENCH")/llama-quantize}
run() { "$@" 2>>"$LOG" | tee -a "$LOG" | grep '^{' >>"$J"; }

if [ "${ATTEND:-1}" != 0 ]; then
    run "$B/bench/bench_attend_cuda"
    run $PEER sdpa
fi
copy=$(grep -m1 -o '"copy_GBps":[0-9.]*' "$J" | cut -d: -f2)
[ "${GEMV:-1}" != 0 ] && run "$B/bench/bench_gemv_cuda"
[ "${KQUANT:-1}" != 0 ] && run "$B/bench/bench_kquant_cuda"
[ "${MOE:-1}" != 0 ] && run "$B/bench/bench_moe_cuda"
[ -n "$copy" ] || copy=$(grep -m1 -o '"copy_GBps":[0-9.]*' "$J" | cut -d: -f2)

# tags every JSON line of one offgraph / llama.cpp figure with its shape, format and context
tag() { sed "s/^{/{\"bench\":\"e2e\",\"shape\":\"$1\",\"weights\":\"$2\",\"impl\":\"$3\",\"context\":$4,/"; }

for shape in $SHAPES; do
    case $shape in
    0.6b) contexts=${CONTEXTS_0_6B:-128 4096 32768} ;;
    *) contexts=${CONTEXTS_8B:-512 4096} ;;
    esac
    max=$(echo $contexts | tr ' ' '\n' | sort -n | tail -1)
    dir=$WORK/qwen3-$shape
    [ -f "$dir/config.json" ] || $PEER make-qwen3 "$dir" "$shape" >>"$LOG" 2>&1
    for wt in $WEIGHTS; do
        ogp=$WORK/qwen3-$shape-$wt.ogp
        args=()
        [ "$wt" != bf16 ] && args=(--weights "$wt")
        t0=$SECONDS
        "$B/offgraph" export "$dir" -o "$ogp" --max-context $((max + 512)) "${args[@]}" >>"$LOG" 2>&1 ||
            echo "export of $shape $wt failed (see $LOG)"
        echo "{\"bench\":\"export\",\"shape\":\"$shape\",\"weights\":\"$wt\",\"seconds\":$((SECONDS - t0))}" >>"$J"
        for ctx in $contexts; do
            out=$("$B/offgraph" bench -m "$ogp" --backend cuda --prompt "$ctx" --gen 256 --json 2>>"$LOG")
            echo "$out" >>"$LOG"
            [ -n "$out" ] && echo "$out" | tag "$shape" "$wt" offgraph "$ctx" >>"$J"
            case $wt in
            q4_k_m | q6_k) $PEER floor-ogp "$ogp" "$ctx" "${copy:-4200}" 2>>"$LOG" | tag "$shape" "$wt" bytes_floor "$ctx" >>"$J" ;;
            *) $PEER floor "$dir" "$ctx" "${copy:-4200}" "$wt" 2>>"$LOG" | tag "$shape" "$wt" bytes_floor "$ctx" >>"$J" ;;
            esac
        done
        rm -f "$ogp"
    done
    for ctx in $contexts; do # TRANSFORMERS=0 leaves the transformers rows out
        [ "${TRANSFORMERS:-1}" = 0 ] && break
        $PEER generate "$dir" "$ctx" 128 2>>"$LOG" | tee -a "$LOG" | grep '^{' | tag "$shape" bf16 transformers_static_cache "$ctx" >>"$J"
    done

    # llama.cpp (CUDA, all layers on the GPU, flash attention on) on the same weights:
    # decode of 128 tokens from depth = context (and, for 0.6b, prefill of a context-long prompt)
    if [ -x "$LLAMA_BENCH" ]; then
        gguf=$WORK/qwen3-$shape.gguf
        PYTHONPATH=$LLAMA_DIR/gguf-py${PYTHONPATH:+:$PYTHONPATH} python3 "$SRC/bench/make_gguf.py" "$dir" "$gguf" >"$WORK/gguf.log" 2>&1 ||
            echo "llama.cpp: writing the GGUF failed: $(tail -1 "$WORK/gguf.log") (LLAMA_DIR=$LLAMA_DIR)"
        cat "$WORK/gguf.log" >>"$LOG"
        depths=$(echo $contexts | tr ' ' ,)
        for wt in $WEIGHTS; do
            file=$gguf
            case $wt in
            q8) file=$WORK/qwen3-$shape-q8_0.gguf; qt=Q8_0 ;;
            q4) file=$WORK/qwen3-$shape-q4_0.gguf; qt=Q4_0 ;;
            q4_k_m) file=$WORK/qwen3-$shape-Q4_K_M.gguf; qt=Q4_K_M ;;
            q6_k) file=$WORK/qwen3-$shape-Q6_K.gguf; qt=Q6_K ;;
            esac
            if [ "$wt" != bf16 ]; then
                if [ -x "$LLAMA_QUANTIZE" ]; then
                    "$LLAMA_QUANTIZE" "$gguf" "$file" "$qt" >>"$LOG" 2>&1 || echo "llama.cpp: llama-quantize $qt failed (see $LOG)"
                else
                    echo "llama.cpp $wt rows skipped: no llama-quantize at $LLAMA_QUANTIZE"
                    continue
                fi
            fi
            lrows=$( { "$LLAMA_BENCH" -m "$file" -ngl 99 -fa on -o jsonl -p 0 -n 128 -d "$depths"
                       if { [ "$shape" = 0.6b ] && [ "$wt" = bf16 ]; } || [ "$wt" = q4_k_m ] || [ "$wt" = q6_k ]; then
                           "$LLAMA_BENCH" -m "$file" -ngl 99 -fa on -o jsonl -p "$depths" -n 0
                       fi; } 2>>"$LOG")
            echo "$lrows" >>"$LOG"
            [ -n "$lrows" ] || echo "llama.cpp: llama-bench gave no result for $shape $wt (see $LOG)"
            echo "$lrows" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
shape, wt = sys.argv[2], sys.argv[3]
for ctx in map(int, sys.argv[1].split()):
    out = {"bench": "e2e", "shape": shape, "weights": wt, "impl": "llama.cpp_cuda_fa", "context": ctx}
    for r in rows:
        if r["n_gen"] > 0 and r["n_depth"] == ctx:
            out["decode_tokens_per_s"] = r["avg_ts"]
            out["build_commit"] = r.get("build_commit")
        if r["n_prompt"] == ctx and r["n_gen"] == 0:
            out["prefill_tokens_per_s"] = r["avg_ts"]
    if len(out) > 5:
        print(json.dumps(out))
' "$contexts" "$shape" "$wt" >>"$J"
            [ "$file" != "$gguf" ] && rm -f "$file"
        done
        rm -f "$gguf"
    else
        echo "llama.cpp rows skipped: no llama-bench at $LLAMA_BENCH (build llama.cpp's llama-bench with CUDA and set LLAMA_BENCH to it, or put it there; README, \"Speed\")" | tee -a "$LOG"
    fi
    [ -n "${BENCH_WORK:-}" ] || rm -rf "$dir"
done

python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
att = [r for r in rows if r.get("bench") == "decode_attention"]
if att:
    print("---- decode attention (Hq=32 Hkv=8 D=128, 1 token; KV storage bf16 unless named)")
    print(f"{'L':>7} {'impl':<16} {'kv':<5} {'us':>9} {'KV GB/s':>9} {'of copy':>8}")
    for r in att:
        frac = f"{r['fraction_of_copy']:.2f}" if "fraction_of_copy" in r else ""
        print(f"{r['L']:>7} {r['impl']:<16} {r.get('kv', 'bf16'):<5} {r['us']:>9.2f} {r['kv_GBps']:>9.0f} {frac:>8}")
e2e = [r for r in rows if r.get("bench", "").startswith("e2e") and "shape" in r]
for shape in dict.fromkeys(r["shape"] for r in e2e):
    print(f"---- end to end, Qwen3-{shape} shape (random weights), batch-1 decode tok/s and fraction of the bytes floor")
    print(f"{'context':>7} {'weights':<7} {'offgraph':>9} {'floor':>7} {'of floor':>8} {'transformers':>12} {'llama.cpp':>9} {'og/llama':>8} {'og prefill':>10} {'llama prefill':>13}")
    sel = [r for r in e2e if r["shape"] == shape]
    for ctx in sorted(set(r["context"] for r in sel)):
        for wt in dict.fromkeys(r["weights"] for r in sel):
            get = lambda impl, k="decode_tokens_per_s": next((r.get(k) for r in sel if r["context"] == ctx and r["weights"] == wt and r["impl"] == impl and r.get(k)), None)
            og, fl, tf, ll = get("offgraph"), get("bytes_floor"), get("transformers_static_cache"), get("llama.cpp_cuda_fa")
            ogp, llp = get("offgraph", "prefill_tokens_per_s"), get("llama.cpp_cuda_fa", "prefill_tokens_per_s")
            f = lambda v, d=0: "" if v is None else f"{v:.{d}f}"
            print(f"{ctx:>7} {wt:<7} {f(og):>9} {f(fl):>7} {f(og / fl if og and fl else None, 2):>8} {f(tf):>12} {f(ll):>9} "
                  f"{(f'{og / ll:.2f}x' if og and ll else ''):>8} {f(ogp):>10} {f(llp):>13}")
    bc = next((r.get("build_commit") for r in sel if r["impl"] == "llama.cpp_cuda_fa"), None)
    if bc:
        print(f"llama.cpp build {bc}")
ex = [r for r in rows if r.get("bench") == "export"]
if ex:
    print("---- export seconds: " + ", ".join(f"{r['shape']} {r['weights']} {r['seconds']}" for r in ex))
PY
[ -n "$(grep -m1 '"bench":"gemv"' "$J")" ] && grep -A 60 -- '---- decode products' "$LOG" | head -46
# BATCH=0 leaves out the batched-decode table (minutes of transformers runs)
if [ "${BATCH:-1}" != 0 ]; then WORK=$WORK bash "$SRC/bench/gpu/batch.sh" "$B"; fi
[ -n "${BENCH_WORK:-}" ] || rm -rf "$WORK"
