#!/usr/bin/env bash
# Slow and idle clients cannot lock others out of offgraph serve (loopback
# only, about a minute): hundreds of connections trickling their headers,
# hundreds sending nothing and a few streams never read, from other loopback
# addresses, while an ordinary client's requests each succeed within a few
# seconds; the trickling and idle ones are cut at --header-timeout (with a
# 408), those past --max-connections-per-ip refused at once, the streams
# never read cut at --write-timeout and their requests cancelled; afterwards
# /metrics shows no request, session or connection left and the server has
# the threads it had before (tests/serve/flood.py). Then --max-connections:
# past it a new connection is refused at once, and once the idle connections
# holding the server are cut, requests are served again.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$SRC/tests/serve/server.sh"
# every connection is a descriptor, on both sides
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 8192 2>/dev/null

# a 10 ms pause after every batched step (a bigger model's step time), so a
# stream of 1000 tokens runs for 10 s: long past its write deadline
export OFFGRAPH_TEST_STEP_DELAY_MS=10
start_server a --max-sessions 8 --max-queue 32 --header-timeout 2 --write-timeout 1.5 \
    --max-connections 1024 --max-connections-per-ip 50 || exit 1
unset OFFGRAPH_TEST_STEP_DELAY_MS
timeout 400 python3 "$SRC/tests/serve/flood.py" "$PORT" "$PID" 2 1.5 50 || fail "the floods (above)"
kill -TERM $PID
wait $PID || fail "server a: exit status $? after SIGTERM: $(tail -3 "$WORK/a.log")"
PID=

start_server b --max-connections 16 --max-connections-per-ip 0 --header-timeout 2 || exit 1
timeout 60 python3 - "$PORT" <<'PY' || fail "--max-connections"
import http.client, socket, sys, time
port = int(sys.argv[1])
idle = []
for _ in range(16):
    s = socket.socket()
    s.bind(("127.0.0.40", 0))
    s.connect(("127.0.0.1", port))
    idle.append(s)
time.sleep(0.3)
t0 = time.monotonic()
try:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/health")
    status = c.getresponse().status
except (ConnectionError, http.client.HTTPException):
    status = None
took = time.monotonic() - t0
print("past --max-connections: %s after %.3f s" % ("refused" if status is None else status, took))
assert status is None and took < 1.5, (status, took)
time.sleep(2.5)  # the idle ones are cut at --header-timeout
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
c.request("GET", "/health")
assert c.getresponse().status == 200
print("served again once the idle connections were cut")
PY
kill -TERM $PID
wait $PID || fail "server b: exit status $? after SIGTERM"
PID=

[ $fails = 0 ] && echo "cli_serve_flood: all passed"
exit $((fails > 0))
