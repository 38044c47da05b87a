# Sourced by the tests that run offgraph serve (tests/cli_serve*.sh): fail
# counting and a server started in the background on a port the kernel picks.
# Needs BIN (the built offgraph) and WORK (a scratch folder) set.
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
PID=
PORT=
# a server left by a failure or a timeout never outlives the test
trap '[ -n "$PID" ] && kill -9 $PID 2>/dev/null' EXIT

# start_server NAME [options]: runs offgraph serve in the background, its
# output in $WORK/NAME.log, and reads the port it picked from its first line
start_server() {
    local name=$1
    shift
    "$BIN" serve --port 0 "$@" >"$WORK/$name.log" 2>&1 &
    PID=$!
    PORT=
    for _ in $(seq 300); do
        PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/$name.log")
        [ -n "$PORT" ] && return 0
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    fail "$name: the server did not start: $(cat "$WORK/$name.log")"
    kill -9 $PID 2>/dev/null
    PID=
    return 1
}
