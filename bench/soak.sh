#!/usr/bin/env bash
# Soak of offgraph serve (loopback only, bounded in time): a mixed load for
# SOAK_SECONDS (default 120) from SOAK_CLIENTS clients (default 16) with
# --kv-budget and --max-queue tight enough that requests wait and some get
# 429, sampling RSS, descriptors, threads and /metrics every 10 s, then a
# table and the verdict (bench/soak.py says what passes). Exit 1 on a
# failed verdict or a server that did not exit 0 on SIGTERM.
#   bash bench/soak.sh [build folder (default build)] [-- offgraph serve options]
#   SOAK_SECONDS=3600 bash bench/soak.sh build
# Defaults: the demo model, --max-sessions 6 --max-queue 4 --kv-budget 10M:
# 16 clients overflow a queue of 4 behind 6 sessions (429s), and the 10 MiB
# the sessions (about 1 MB each at the demo model's whole context of 1,024
# tokens) and the prefix cache share leave the cache some room; options
# after -- replace them (give all of them then).
set -u
BUILD=${1:-build}
shift 2>/dev/null
[ "${1:-}" = "--" ] && shift
BIN=$(cd "$BUILD" 2>/dev/null && pwd)/offgraph
SRC=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$BIN" ] || { echo "bench/soak.sh: no $BIN (build first)" >&2; exit 1; }
SECONDS_RUN=${SOAK_SECONDS:-120}
CLIENTS=${SOAK_CLIENTS:-16}
CONTEXT=${SOAK_CONTEXT:-1024}
if [ $# -eq 0 ]; then set -- --max-sessions 6 --max-queue 4 --kv-budget 10M; fi
LOG=$(mktemp)
"$BIN" serve --port 0 "$@" >"$LOG" 2>&1 &
PID=$!
trap 'kill -9 $PID 2>/dev/null; rm -f "$LOG"' EXIT
PORT=
for _ in $(seq 600); do
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG")
    [ -n "$PORT" ] && break
    kill -0 $PID 2>/dev/null || break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "bench/soak.sh: the server did not start: $(cat "$LOG")" >&2; exit 1; }
echo "soak: offgraph serve $* on port $PORT ($(head -1 "$LOG" | sed 's/.*: model //')), $CLIENTS clients, $SECONDS_RUN s"
timeout $((SECONDS_RUN + 400)) python3 "$SRC/bench/soak.py" "$PORT" "$PID" "$SECONDS_RUN" "$CLIENTS" "$CONTEXT"
rc=$?
kill -TERM $PID
for _ in $(seq 300); do kill -0 $PID 2>/dev/null || break; sleep 0.1; done
wait $PID
src=$?
[ $src -eq 0 ] || { echo "soak: the server exited $src after SIGTERM: $(tail -3 "$LOG")"; rc=1; }
grep -v "^offgraph serve: model" "$LOG" | tail -20 | sed 's/^/server: /'
exit $rc
