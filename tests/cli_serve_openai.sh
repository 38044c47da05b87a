#!/usr/bin/env bash
# offgraph serve with a real client: the `openai` npm package (installed
# here on first use into the build folder, then reused) does streaming and
# non-streaming completions and chat completions over loopback
# (tests/serve/openai_client.mjs). Skipped (77) only where npm is absent.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "cli_serve_openai: npm or node is missing: skipped"
    exit 77
fi
CLIENT=$(dirname "$WORK")/openai-client
if [ ! -f "$CLIENT/node_modules/openai/package.json" ]; then
    mkdir -p "$CLIENT"
    [ -f "$CLIENT/package.json" ] || echo '{"name": "offgraph-serve-test", "private": true}' >"$CLIENT/package.json"
    timeout 600 npm install --prefix "$CLIENT" --no-audit --no-fund --loglevel=error openai@4 >"$WORK/npm.log" 2>&1 || {
        echo "FAIL: npm install openai: $(tail -5 "$WORK/npm.log")"
        exit 1
    }
fi
"$BIN" serve --port 0 --api-key k3y >"$WORK/serve.log" 2>&1 &
PID=$!
PORT=
for _ in $(seq 300); do
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/serve.log")
    [ -n "$PORT" ] && break
    sleep 0.1
done
if [ -z "$PORT" ]; then
    echo "FAIL: the server did not start: $(cat "$WORK/serve.log")"
    kill -9 $PID 2>/dev/null
    exit 1
fi
timeout 120 node "$SRC/tests/serve/openai_client.mjs" "$PORT" "$CLIENT"
rc=$?
kill -TERM $PID
for _ in $(seq 200); do kill -0 $PID 2>/dev/null || break; sleep 0.1; done
kill -0 $PID 2>/dev/null && { echo "FAIL: the server outlived SIGTERM"; kill -9 $PID; rc=1; }
wait $PID || { echo "FAIL: the server's exit status after SIGTERM"; rc=1; }
exit $rc
