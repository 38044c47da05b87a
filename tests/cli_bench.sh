#!/usr/bin/env bash
# offgraph bench --sessions K runs K requests through the library's engine;
# --direct steps the same K sessions on the direct step path. Both take about
# the same number of model steps (the warm-up's prefill and one decode step,
# the timed prefill, then one decode step a token) and hold the same KV, but
# for the engine never feeding a request's last token (one row a session less).
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
command -v python3 >/dev/null || { echo "cli_bench: python3 is missing: skipped"; exit 77; }

"$BIN" export "$SRC/tests/data/hf/qwen2-bias" -o "$WORK/q.ogp" 2>/dev/null || { echo "FAIL: export"; exit 1; }
for k in 1 3; do
    "$BIN" bench -m "$WORK/q.ogp" --backend cpu --sessions $k --prompt 20 --gen 5 --json >"$WORK/e$k.json" 2>&1 ||
        fail "bench --sessions $k: $(cat "$WORK/e$k.json")"
    "$BIN" bench -m "$WORK/q.ogp" --backend cpu --sessions $k --prompt 20 --gen 5 --json --direct >"$WORK/d$k.json" 2>&1 ||
        fail "bench --sessions $k --direct: $(cat "$WORK/d$k.json")"
    python3 - "$WORK/e$k.json" "$WORK/d$k.json" $k <<'PY' || fail "bench --sessions $k: engine $(cat "$WORK/e$k.json"), direct $(cat "$WORK/d$k.json")"
import json, sys
e, d, k = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
assert e["mode"] == "engine" and d["mode"] == "batched", (e["mode"], d["mode"])
# the direct path's steps: the warm-up's prefill, the timed prefill, one
# untimed and 5 timed decode steps; the engine's are as many when its
# scheduler takes the K requests in one step, more when it starts one before
# the others are submitted (a step each, then decode beside prefill)
assert e["sessions"] == d["sessions"] == k and d["steps"] == 3 + 5 <= e["steps"] <= 2 * k + (k + 5), (e["steps"], d["steps"])
assert e["prefill_tokens_per_s"] > 0 and e["decode_tokens_per_s"] > 0, e
assert abs(e["decode_tokens_per_s_per_session"] * k - e["decode_tokens_per_s"]) < 0.05 * e["decode_tokens_per_s"], e
# KV rows of the prompt and every generated token but the last: 20 + 6 - 1
# against the direct path's 20 + 7 - 1 (it feeds its last token)
assert e["kv_bytes_live"] * 26 == d["kv_bytes_live"] * 25, (e["kv_bytes_live"], d["kv_bytes_live"])
PY
done
"$BIN" bench -m "$WORK/q.ogp" --backend cpu --prompt 20 --gen 5 --json | grep -q '"mode":"batched"' ||
    fail "bench without --sessions is not on the direct step path"
[ $fails -eq 0 ] && echo "cli_bench: all passed"
exit $((fails > 0))
