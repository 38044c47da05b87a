#!/usr/bin/env bash
# Prefix reuse in offgraph serve (--prefix-cache-bytes): the same multi-turn
# chat (three conversations of three turns, each turn resending the whole
# history as OpenAI clients do, greedy) sent over HTTP with curl
#   A. to a server with the cache, twice over,
#   B. to a server without it (--prefix-cache-bytes 0),
# gives the same replies every time (the oracle is B: every prompt read in
# full); A's /metrics show hits and reused tokens, and its prefilled plus
# reused prompt tokens add up to the prompt tokens the responses report; B
# shows none; the responses' usage.prompt_tokens_details.cached_tokens add
# up to the reused tokens (0 on B). C: under a --kv-budget that holds one request's reservation
# but not that and the cache, requests still run (the cache is evicted
# first) and /metrics count the evictions. Every call has a timeout.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK"
command -v curl >/dev/null || { echo "cli_serve_prefix: curl is missing: skipped"; exit 77; }
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
. "$SRC/tests/serve/server.sh"

stop_server() {
    kill -TERM $PID 2>/dev/null
    for _ in $(seq 200); do
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    kill -0 $PID 2>/dev/null && { fail "$1: still running 20 s after SIGTERM"; kill -9 $PID; }
    wait $PID
    local rc=$?
    [ $rc -eq 0 ] || fail "$1: exit status $rc after SIGTERM"
    PID=
}

# metric NAME: its value in /metrics
metric() {
    curl -s --max-time 30 "http://127.0.0.1:$PORT/metrics" | awk -v n="offgraph_$1" '$1 == n { print $2 }'
}

# chat OUT: runs the fixed conversations against $PORT, one reply a line in
# OUT; the sum of the responses' usage.prompt_tokens in OUT.prompt
chat() {
    local out=$1 hist reply body status prompt_sum=0
    : >"$out"
    for c in 0 1 2; do
        hist="$WORK/hist.json"
        python3 - "$c" >"$hist" <<'PY'
import json, sys
systems = ["You are a preacher of the old book, and you answer in its words.",
           "Thou art a scribe of the law; speak plainly unto the people.",
           "You are a preacher of the old book, and you answer in its words."]
c = int(sys.argv[1])
json.dump([{"role": "system", "content": systems[c]}], sys.stdout)
PY
        for t in 0 1 2; do
            body=$(python3 - "$hist" "$c" "$t" <<'PY'
import json, sys
hist = json.load(open(sys.argv[1]))
asks = [["Tell me of the king of Israel.", "And what did the prophet say unto him?", "Where did they go then?"],
        ["What is the first commandment?", "Say it again, and the second also.", "Who gave them?"],
        ["Tell me of the king of Israel.", "What became of his sons?", "And of his servants?"]]
hist.append({"role": "user", "content": asks[int(sys.argv[2])][int(sys.argv[3])]})
json.dump(hist, open(sys.argv[1], "w"))
print(json.dumps({"model": "kjv-tiny", "messages": hist, "temperature": 0, "max_tokens": 24}))
PY
)
            status=$(curl -s --max-time 120 -o "$WORK/out" -w '%{http_code}' -H 'Content-Type: application/json' \
                --data-binary "$body" "http://127.0.0.1:$PORT/v1/chat/completions")
            if [ "$status" != 200 ]; then
                fail "conversation $c turn $t: HTTP $status: $(head -c 300 "$WORK/out")"
                echo "<error>" >>"$out"
                continue
            fi
            python3 - "$WORK/out" "$hist" "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
reply = r["choices"][0]["message"]["content"]
hist = json.load(open(sys.argv[2]))
hist.append({"role": "assistant", "content": reply})
json.dump(hist, open(sys.argv[2], "w"))
with open(sys.argv[3], "a") as f:
    f.write(json.dumps(reply) + "\n")
with open(sys.argv[3] + ".prompt", "a") as f:
    f.write("%d\n" % r["usage"]["prompt_tokens"])
with open(sys.argv[3] + ".cached", "a") as f:
    f.write("%d\n" % r["usage"]["prompt_tokens_details"]["cached_tokens"])
PY
        done
    done
}

sum() { awk '{ s += $1 } END { print s + 0 }' "$1"; }

# ---------------------------------------------------------------- B: oracle
if start_server nocache --prefix-cache-bytes 0; then
    chat "$WORK/b.txt"
    [ "$(metric prefix_cache_hits_total)" = 0 ] || fail "B: prefix cache hits without a cache"
    [ "$(metric prompt_tokens_reused_total)" = 0 ] || fail "B: tokens reused without a cache"
    [ "$(metric prefix_cache_bytes_max)" = 0 ] || fail "B: --prefix-cache-bytes 0 is not reported as 0"
    [ "$(sum "$WORK/b.txt.cached")" = 0 ] || fail "B: usage reports cached tokens without a cache"
    stop_server nocache
fi

# ---------------------------------------------------------------- A: cache
if start_server cache; then
    chat "$WORK/a1.txt"
    hits1=$(metric prefix_cache_hits_total)
    chat "$WORK/a2.txt"
    hits=$(metric prefix_cache_hits_total)
    reused=$(metric prompt_tokens_reused_total)
    prefilled=$(metric prompt_tokens_total)
    held=$(metric prefix_cache_bytes_held)
    total=$(($(sum "$WORK/a1.txt.prompt") + $(sum "$WORK/a2.txt.prompt")))
    echo "A: $hits hits, $reused prompt tokens reused, $prefilled prefilled, of $total; cache holds $held bytes"
    # first pass: turns 2 and 3 of each conversation, and the third
    # conversation's first turn (the first's system prompt and question)
    [ "${hits1:-0}" -ge 7 ] || fail "A: first pass: $hits1 hits, want at least 7"
    # second pass: every turn
    [ "${hits:-0}" -ge $((hits1 + 9)) ] || fail "A: second pass: $((hits - hits1)) hits, want 9"
    [ $((reused + prefilled)) -eq "$total" ] || fail "A: reused $reused + prefilled $prefilled != $total prompt tokens"
    cached=$(($(sum "$WORK/a1.txt.cached") + $(sum "$WORK/a2.txt.cached")))
    [ "$cached" -eq "$reused" ] || fail "A: usage.prompt_tokens_details.cached_tokens add up to $cached, /metrics says $reused"
    [ "${reused:-0}" -gt $((total / 2)) ] || fail "A: only $reused of $total prompt tokens reused"
    [ "${held:-0}" -gt 0 ] || fail "A: the cache holds nothing"
    stop_server cache
fi
for f in a1 a2; do
    if ! cmp -s "$WORK/b.txt" "$WORK/$f.txt"; then
        fail "A ($f) and B differ:"
        diff "$WORK/b.txt" "$WORK/$f.txt" | head -10
    fi
done
[ "$(wc -l <"$WORK/b.txt")" -eq 9 ] || fail "B: $(wc -l <"$WORK/b.txt") replies, want 9"
grep -q '<error>' "$WORK/b.txt" && fail "B: failed requests"

# ------------------------------------------------- C: cache under a budget
# learn one request's reservation and one cached session's bytes, then run
# the chat under a budget that holds the first but not both
if start_server probe; then
    chat "$WORK/p.txt"
    one=$(metric prefix_cache_bytes_held)
    entries=$(metric prefix_cache_entries)
    stop_server probe
    per=$((one / entries))
    if start_server budget --kv-budget $((per * 3 / 2)) --max-sessions 1; then
        chat "$WORK/c.txt"
        ev=$(metric prefix_cache_evictions_total)
        held=$(metric prefix_cache_bytes_held)
        echo "C: budget $((per * 3 / 2)) bytes: $ev evictions, $held bytes held at the end"
        [ "${ev:-0}" -gt 0 ] || fail "C: no eviction under the budget"
        [ "${held:-0}" -le $((per * 3 / 2)) ] || fail "C: the cache holds $held bytes, over the budget"
        cmp -s "$WORK/b.txt" "$WORK/c.txt" || fail "C: replies differ from B's"
        stop_server budget
    fi
fi

[ $fails -eq 0 ] && echo "cli_serve_prefix: ok" || echo "cli_serve_prefix: $fails failure(s)"
[ $fails -eq 0 ]
