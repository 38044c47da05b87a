#!/usr/bin/env bash
# GPU benchmarks side by side with their peers, in one run, from a folder made
# by tests/gpu/pack.sh. Needs python3 with torch and transformers. Prints a
# table last; JSON lines go to $RESULTS_DIR/bench.jsonl (default <build-dir>/results).
#   1. decode attention, Hq=32 Hkv=8 D=128 bf16, histories 4k/32k/128k:
#      offgraph (bench_attend_cuda) and torch SDPA enable_gqa=True; KV bytes per
#      second as a fraction of a device-to-device copy measured in the same run.
#   2. end-to-end decode tokens/s, Qwen3-0.6B shape (random bf16 weights), at
#      contexts 128, 4096 and 32768: offgraph bench, transformers generate with a
#      static cache, llama.cpp's llama-bench (CUDA, flash attention on) on a GGUF
#      of the same weights, and the bytes floor (weights + KV read once per token
#      at copy rate).
#   3. prefill tokens/s of a prompt of the context's length (128, 4096, 32768),
#      offgraph and llama.cpp.
#   llama.cpp: $LLAMA_BENCH, else build-llama-cuda/bin/llama-bench under the
#   source root; the GGUF is written by bench/make_gguf.py with the gguf Python
#   package ($LLAMA_DIR/gguf-py, default build-llama-cuda/gguf-py, or installed).
#   Without them its rows are skipped with a line saying so (README, "Speed").
#   4. aggregate decode of K sessions in one batched step at context 512, against
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
WORK=$(mktemp -d)
run() { "$@" 2>>"$LOG" | tee -a "$LOG" | grep '^{' >>"$J"; }

run "$B/bench/bench_attend_cuda"
copy=$(grep -m1 -o '"copy_GBps":[0-9.]*' "$J" | cut -d: -f2)
run $PEER sdpa

$PEER make-qwen3 "$WORK/qwen3" >>"$LOG" 2>&1
"$B/offgraph" export "$WORK/qwen3" -o "$WORK/qwen3.ogp" --max-context 40960 >>"$LOG" 2>&1 || echo "export failed (see $LOG)"
CONTEXTS=${CONTEXTS:-128 4096 32768}
for ctx in $CONTEXTS; do
    out=$("$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --prompt $ctx --gen 256 --json 2>>"$LOG")
    echo "$out" >>"$LOG"
    [ -n "$out" ] && echo "$out" | sed "s/^{/{\"bench\":\"e2e\",\"impl\":\"offgraph\",\"context\":$ctx,/" >>"$J"
    run $PEER generate "$WORK/qwen3" $ctx 128
    run $PEER floor "$WORK/qwen3" $ctx "${copy:-4200}"
done

# llama.cpp (CUDA, all layers on the GPU, flash attention on) on the same weights:
# decode of 256 tokens from depth = context, and prefill of a context-long prompt
LLAMA_DIR=${LLAMA_DIR:-$SRC/build-llama-cuda}
LLAMA_BENCH=${LLAMA_BENCH:-$LLAMA_DIR/bin/llama-bench}
if [ -x "$LLAMA_BENCH" ]; then
    PYTHONPATH=$LLAMA_DIR/gguf-py${PYTHONPATH:+:$PYTHONPATH} python3 "$SRC/bench/make_gguf.py" "$WORK/qwen3" "$WORK/qwen3.gguf" >"$WORK/gguf.log" 2>&1 ||
        echo "llama.cpp: writing the GGUF failed: $(tail -1 "$WORK/gguf.log") (LLAMA_DIR=$LLAMA_DIR)"
    cat "$WORK/gguf.log" >>"$LOG"
    depths=$(echo $CONTEXTS | tr ' ' ,)
    lrows=$( { "$LLAMA_BENCH" -m "$WORK/qwen3.gguf" -ngl 99 -fa on -o jsonl -p 0 -n 256 -d "$depths"
               "$LLAMA_BENCH" -m "$WORK/qwen3.gguf" -ngl 99 -fa on -o jsonl -p "$depths" -n 0; } 2>>"$LOG")
    echo "$lrows" >>"$LOG"
    [ -n "$lrows" ] || echo "llama.cpp: llama-bench gave no result (see $LOG)"
    echo "$lrows" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
for ctx in map(int, sys.argv[1].split()):
    out = {"bench": "e2e", "impl": "llama.cpp_cuda_fa", "context": ctx}
    for r in rows:
        if r["n_gen"] > 0 and r["n_depth"] == ctx:
            out["decode_tokens_per_s"] = r["avg_ts"]
            out["build_commit"] = r.get("build_commit")
        if r["n_prompt"] == ctx and r["n_gen"] == 0:
            out["prefill_tokens_per_s"] = r["avg_ts"]
    if len(out) > 3:
        print(json.dumps(out))
' "$CONTEXTS" >>"$J"
else
    echo "llama.cpp rows skipped: no llama-bench at $LLAMA_BENCH (build llama.cpp's llama-bench with CUDA and set LLAMA_BENCH to it, or put it there; README, \"Speed\")" | tee -a "$LOG"
fi

python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("---- decode attention (Hq=32 Hkv=8 D=128, 1 token; KV storage bf16 unless named)")
print(f"{'L':>7} {'impl':<16} {'kv':<5} {'us':>9} {'KV GB/s':>9} {'of copy':>8}")
for r in rows:
    if r.get("bench") == "decode_attention":
        frac = f"{r['fraction_of_copy']:.2f}" if "fraction_of_copy" in r else ""
        print(f"{r['L']:>7} {r['impl']:<16} {r.get('kv', 'bf16'):<5} {r['us']:>9.2f} {r['kv_GBps']:>9.0f} {frac:>8}")
print("---- end to end, Qwen3-0.6B shape (random bf16 weights)")
print(f"{'context':>7} {'impl':<28} {'decode tok/s':>12} {'prefill tok/s':>13}")
e2e = sorted((r for r in rows if r.get("bench", "").startswith("e2e")), key=lambda r: r["context"])
for r in e2e:
    dec = f"{r['decode_tokens_per_s']:.0f}" if "decode_tokens_per_s" in r else ""
    pre = f"{r['prefill_tokens_per_s']:.0f}" if "prefill_tokens_per_s" in r else ""
    print(f"{r['context']:>7} {r['impl']:<28} {dec:>12} {pre:>13}")
peer = {r["context"]: r for r in e2e if r["impl"] == "llama.cpp_cuda_fa"}
if peer:
    print("---- offgraph / llama.cpp (CUDA, flash attention), same weights, prefill of a context-long prompt")
    print(f"{'context':>7} {'decode':>8} {'prefill':>8}")
    for r in e2e:
        p = peer.get(r["context"])
        if r["impl"] != "offgraph" or not p:
            continue
        ratio = lambda k: f"{r[k] / p[k]:.2f}x" if r.get(k) and p.get(k) else ""
        print(f"{r['context']:>7} {ratio('decode_tokens_per_s'):>8} {ratio('prefill_tokens_per_s'):>8}")
    print(f"llama.cpp build {next(iter(peer.values())).get('build_commit')}")
PY
# BATCH=0 leaves out the batched-decode table (minutes of transformers runs)
if [ "${BATCH:-1}" != 0 ]; then WORK=$WORK bash "$SRC/bench/gpu/batch.sh" "$B"; fi
rm -rf "$WORK"
