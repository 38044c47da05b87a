#!/usr/bin/env bash
# Prefix reuse in offgraph serve: a fixed chat script (CONVERSATIONS
# conversations of TURNS turns, one shared system prompt, each turn resending
# the whole history as OpenAI clients do, greedy, max_tokens MAXTOK, streamed)
# sent over HTTP to a server with the prefix cache (the default) and to one
# without it (--prefix-cache-bytes 0). For each: prompt tokens sent, tokens
# reused (from /metrics), % of prefill saved, time to first token (median,
# p90, mean) and the script's wall time; and whether the replies were the
# same (they must be: greedy output does not depend on the cache).
#
# Usage: bash bench/serve_prefix.sh [build folder (default build)] [-- offgraph serve options, e.g. -m model.ogp]
#   CONVERSATIONS=6 TURNS=6 MAXTOK=32 bash bench/serve_prefix.sh build
set -u
BUILD=${1:-build}
shift $(($# > 0 ? 1 : 0))
[ "${1:-}" = "--" ] && shift
BIN=$BUILD/offgraph
[ -x "$BIN" ] || { echo "bench/serve_prefix.sh: no $BIN (build first)" >&2; exit 1; }
export CONVERSATIONS=${CONVERSATIONS:-6} TURNS=${TURNS:-6} MAXTOK=${MAXTOK:-32}
WORK=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && { kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; }; rm -rf "$WORK"' EXIT

run() { # NAME [serve options]
    local name=$1 port=
    shift
    "$BIN" serve --port 0 "$@" >"$WORK/$name.log" 2>&1 &
    PID=$!
    for _ in $(seq 600); do
        port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/$name.log")
        [ -n "$port" ] && break
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "bench/serve_prefix.sh: the server did not start: $(cat "$WORK/$name.log")" >&2; exit 1; }
    timeout 1200 python3 - "$port" "$name" "$WORK/$name.replies" <<'PY'
import json, os, sys, time, urllib.request
port, name, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
C, T, MAXTOK = int(os.environ["CONVERSATIONS"]), int(os.environ["TURNS"]), int(os.environ["MAXTOK"])
base = "http://127.0.0.1:%d" % port
system = ("You are a scribe who has read the whole of the old book, from the beginning of the world to the "
          "revelation at its end. Answer every question in the words of that book, plainly and briefly, and "
          "name the book and the chapter when you can.")
asks = ["Tell me of the king of Israel.", "What did the prophet say unto him?", "Where did they go then?",
        "Who was with them?", "What became of their sons?", "And what of the land?", "Who gave the law?",
        "Say the first commandment.", "What is written of the sea?", "Tell me of the temple."]
def metrics():
    text = urllib.request.urlopen(base + "/metrics", timeout=60).read().decode()
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m
model = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=60).read())["data"][0]["id"]
m0 = metrics()
ttft, replies = [], []
t_all = time.time()
for c in range(C):
    hist = [{"role": "system", "content": system}]
    for t in range(T):
        hist.append({"role": "user", "content": asks[(c + t) % len(asks)]})
        body = json.dumps({"model": model, "messages": hist, "temperature": 0, "max_tokens": MAXTOK,
                           "stream": True}).encode()
        req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.time()
        first, text = None, ""
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                d = ev["choices"][0].get("delta", {}).get("content")
                if d:
                    if first is None:
                        first = time.time() - t0
                    text += d
        ttft.append(first if first is not None else time.time() - t0)
        replies.append(text)
        hist.append({"role": "assistant", "content": text})
wall = time.time() - t_all
m1 = metrics()
d = lambda k: m1.get("offgraph_" + k, 0) - m0.get("offgraph_" + k, 0)
prefilled, reused = d("prompt_tokens_total"), d("prompt_tokens_reused_total")
sent = prefilled + reused
ttft.sort()
pct = lambda p: ttft[min(len(ttft) - 1, int(p * len(ttft)))] * 1e3
print("| %s | %d | %d | %d | %.1f %% | %.1f | %.1f | %.1f | %.2f |" % (
    name, len(ttft), sent, reused, 100.0 * reused / sent if sent else 0, pct(0.5), pct(0.9),
    1e3 * sum(ttft) / len(ttft), wall))
json.dump(replies, open(out, "w"))
PY
    kill -TERM $PID 2>/dev/null
    wait $PID 2>/dev/null
    PID=
}

echo "offgraph serve, $CONVERSATIONS conversations x $TURNS turns (history resent each turn), greedy, max_tokens $MAXTOK, streamed, one client"
echo
echo "| server | requests | prompt tokens sent | reused from the cache | prefill saved | TTFT p50 ms | TTFT p90 ms | TTFT mean ms | script s |"
echo "|---|---|---|---|---|---|---|---|---|"
run "prefix cache" "$@"
run "no cache" --prefix-cache-bytes 0 "$@"
if cmp -s "$WORK/prefix cache.replies" "$WORK/no cache.replies"; then
    echo
    echo "replies: identical with and without the cache"
else
    echo
    echo "replies: DIFFER with and without the cache"
    exit 1
fi
