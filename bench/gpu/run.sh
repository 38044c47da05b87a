#!/usr/bin/env bash
# GPU benchmarks side by side with their peers, in one run, from a folder made
# by tests/gpu/pack.sh. Needs python3 with torch and transformers. Prints a
# table last; JSON lines go to $RESULTS_DIR/bench.jsonl (default <build-dir>/results).
#   1. decode attention, Hq=32 Hkv=8 D=128 bf16, histories 4k/32k/128k:
#      offgraph (bench_attend_cuda) and torch SDPA enable_gqa=True; KV bytes per
#      second as a fraction of a device-to-device copy measured in the same run.
#   2. end-to-end decode tokens/s, Qwen3-0.6B shape (random bf16 weights), at
#      contexts 128 and 4096: offgraph bench, transformers generate with a static
#      cache, and the bytes floor (weights + KV read once per token at copy rate).
#   3. prefill tokens/s of a 4096-token prompt.
#   4. aggregate decode of K sessions in one batched step at context 512, against
#      transformers batched generate (bench/gpu/batch.sh; its table comes last).
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
"$B/offgraph" export "$WORK/qwen3" -o "$WORK/qwen3.ogp" --max-context 8192 >>"$LOG" 2>&1 || echo "export failed (see $LOG)"
for ctx in 128 4096; do
    out=$("$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --prompt $ctx --gen 256 --json 2>>"$LOG")
    echo "$out" >>"$LOG"
    [ -n "$out" ] && echo "$out" | sed "s/^{/{\"bench\":\"e2e\",\"impl\":\"offgraph\",\"context\":$ctx,/" >>"$J"
    run $PEER generate "$WORK/qwen3" $ctx 128
    run $PEER floor "$WORK/qwen3" $ctx "${copy:-4200}"
done

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
for r in rows:
    if r.get("bench", "").startswith("e2e"):
        pre = f"{r['prefill_tokens_per_s']:.0f}" if "prefill_tokens_per_s" in r else ""
        print(f"{r['context']:>7} {r['impl']:<28} {r['decode_tokens_per_s']:>12.0f} {pre:>13}")
PY
WORK=$WORK bash "$SRC/bench/gpu/batch.sh" "$B"
rm -rf "$WORK"
