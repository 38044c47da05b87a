#!/usr/bin/env bash
# Aggregate decode of many sessions in one batched step, side by side with
# transformers batched generate (static cache, greedy), in one run, from a
# folder made by tests/gpu/pack.sh; bench/gpu/run.sh calls it last. A Qwen3
# shape (SHAPE), random bf16 weights, random prompts of CTX tokens per session, GEN
# timed decode tokens. JSON lines go to $RESULTS_DIR/batch.jsonl (default
# <build-dir>/results); a table comes last, and the check that every batch
# bucket offgraph used captured its graph once (no re-capture).
#   bench/gpu/batch.sh <build-dir>
# Environment: KS (batch sizes, default "1 8 64 256"), CTX (512), GEN (128),
# SHAPE (0.6b, or 8b: peer.py make-qwen3's shapes), WEIGHTS (bf16, or q8 / q4:
# offgraph's program quantized by export --weights; transformers keeps bf16),
# PEER_RUN (off: offgraph alone), PEER_COMPILE (off: transformers without its
# automatic torch.compile), OG_TIMEOUT (seconds one offgraph bench may take,
# default 300), WORK (a folder holding qwen3/ and qwen3.ogp to reuse; default:
# made here).
set -u
B=$(cd "${1:?usage: bench/gpu/batch.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
RES=${RESULTS_DIR:-$B/results}
KS=${KS:-1 8 64 256}
CTX=${CTX:-512}
GEN=${GEN:-128}
mkdir -p "$RES"
J=$RES/batch.jsonl
LOG=$RES/batch.log
: >"$J"
: >"$LOG"
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
PEER="python3 $SRC/bench/gpu/peer.py"
OWN=
if [ -z "${WORK:-}" ]; then
    WORK=$(mktemp -d)
    OWN=1
fi
SHAPE=${SHAPE:-0.6b}
WEIGHTS=${WEIGHTS:-bf16}
if [ ! -f "$WORK/qwen3.ogp" ]; then
    $PEER make-qwen3 "$WORK/qwen3" "$SHAPE" >>"$LOG" 2>&1
    wargs=()
    [ "$WEIGHTS" != bf16 ] && wargs=(--weights "$WEIGHTS")
    "$B/offgraph" export "$WORK/qwen3" -o "$WORK/qwen3.ogp" --max-context 8192 "${wargs[@]}" >>"$LOG" 2>&1 ||
        echo "export failed (see $LOG)"
fi
for k in $KS; do
    echo "== offgraph bench --sessions $k --prompt $CTX --gen $GEN" >>"$LOG"
    out=$(timeout "${OG_TIMEOUT:-300}" "$B/offgraph" bench -m "$WORK/qwen3.ogp" --backend cuda --sessions "$k" --prompt "$CTX" --gen "$GEN" --json 2>>"$LOG")
    echo "$out" >>"$LOG"
    [ -n "$out" ] && echo "$out" | sed "s/^{/{\"bench\":\"batch_decode\",\"impl\":\"offgraph\",\"context\":$CTX,/" >>"$J"
done
# shellcheck disable=SC2086
[ "${PEER_RUN:-on}" != off ] && $PEER batch "$WORK/qwen3" "$CTX" "$GEN" $KS 2>>"$LOG" | tee -a "$LOG" | grep '^{' >>"$J"
[ -n "$OWN" ] && rm -rf "$WORK"

python3 - "$J" "$KS" "$SHAPE" "$WEIGHTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
og = {r["sessions"]: r for r in rows if r.get("impl") == "offgraph"}
tf = {r["sessions"]: r for r in rows if r.get("impl", "").startswith("transformers")}
print(f"---- aggregate decode, Qwen3-{sys.argv[3].upper()} shape (random weights, offgraph {sys.argv[4]}), batched step")
print(f"{'K':>4} {'offgraph tok/s':>14} {'per session':>11} {'transformers':>12} {'ratio':>6}  graph captures by bucket")
bad = []
for k in map(int, sys.argv[2].split()):
    o, t = og.get(k), tf.get(k)
    a = f"{o['decode_tokens_per_s']:.0f}" if o else "failed"
    s = f"{o['decode_tokens_per_s_per_session']:.1f}" if o else ""
    p = f"{t['decode_tokens_per_s']:.0f}" if t else ("failed" if tf else "not run")
    ratio = f"{o['decode_tokens_per_s'] / t['decode_tokens_per_s']:.2f}" if o and t else ""
    caps = ""
    if o:
        used = [b for b in range(len(o["bucket_captures"])) if o["bucket_captures"][b] or o["bucket_replays"][b]]
        caps = " ".join(f"{1 << b}:{o['bucket_captures'][b]}" for b in used)
        bad += [(k, 1 << b, o["bucket_captures"][b]) for b in used if o["bucket_captures"][b] != 1]
    print(f"{k:>4} {a:>14} {s:>11} {p:>12} {ratio:>6}  {caps}")
if tf:
    print("transformers: torch.compile " + ("on (automatic)" if next(iter(tf.values()))["compiled"] else "off"))
if og and not any(sum(o["bucket_captures"]) for o in og.values()):
    print("no graph captures reported (decode steps ran without graphs)")
elif og and not bad:
    print("re-captures: 0 (every bucket used was captured once)")
for k, b, n in bad:
    print(f"K={k}: bucket of {b} sessions captured {n} times (want 1)")
PY
