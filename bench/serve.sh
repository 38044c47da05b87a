#!/usr/bin/env bash
# Load benchmark of offgraph serve over loopback: for N = 1, 16, 64
# concurrent streaming clients (each sends a completion, reads its stream to
# [DONE], and sends the next, for BENCH_SECONDS), requests/s, output tokens/s,
# p50/p99 time to first token and time per output token, and errors.
# Bounded: BENCH_SECONDS per level (default 20), MAXTOK tokens a request (64).
# The server keeps its own --max-sessions (64 on the CPU, 256 on a GPU)
# unless the options after -- give one.
#
# Usage: bash bench/serve.sh [build folder (default build)] [-- offgraph serve options, e.g. -m model.ogp]
#   BENCH_SECONDS=20 MAXTOK=64 LEVELS="1 16 64" bash bench/serve.sh build
set -u
BUILD=${1:-build}
shift $(($# > 0 ? 1 : 0))
[ "${1:-}" = "--" ] && shift
BIN=$BUILD/offgraph
SRC=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_PER=${BENCH_SECONDS:-20}
MAXTOK=${MAXTOK:-64}
LEVELS=${LEVELS:-"1 16 64"}
[ -x "$BIN" ] || { echo "bench/serve.sh: no $BIN (build first)" >&2; exit 1; }
LOG=$(mktemp)
"$BIN" serve --port 0 "$@" >"$LOG" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; rm -f "$LOG"' EXIT
PORT=
for _ in $(seq 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG")
    [ -n "$PORT" ] && break
    kill -0 $PID 2>/dev/null || break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "bench/serve.sh: the server did not start: $(cat "$LOG")" >&2; exit 1; }
echo "offgraph serve on port $PORT: $(head -1 "$LOG" | sed 's/.*: model //'); $SECONDS_PER s a level, max_tokens $MAXTOK"
echo
printf '| clients | requests | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | per-token p50 ms | per-token p99 ms | errors |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for n in $LEVELS; do
    line=$(timeout $((SECONDS_PER + 240)) python3 "$SRC/tests/serve/sse.py" load "$PORT" "$n" "$SECONDS_PER" "$MAXTOK")
    python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
print("| %d | %d | %.2f | %.1f | %.1f | %.1f | %.2f | %.2f | %d |" % (
    r["clients"], r["requests"], r["requests_per_s"], r["output_tok_per_s"], r["ttft_p50_ms"], r["ttft_p99_ms"],
    r["tpot_p50_ms"], r["tpot_p99_ms"], r["errors"]))
if r["first_error"]:
    print("first error: " + r["first_error"], file=sys.stderr)
PY
done
