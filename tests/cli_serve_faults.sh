#!/usr/bin/env bash
# KV memory that runs out under load fails one request, never another
# (loopback only, a few minutes at most): a server where one KV
# allocation in 6 fails (OFFGRAPH_TEST_KV_FAIL_EVERY, the back ends' allocators'
# fault injection) serves 8 clients' greedy requests until 100 have failed;
# every request either has exactly the text a server without faults gives
# it, or fails alone with a 503 before its first byte or a stream that ends
# with finish_reason "error", an error event and [DONE]
# (tests/serve/faults.py); afterwards the server is up and idle, no session
# or KV left. Every prompt opens with the same 40 words, so that requests
# start from forks of the prefix cache's sessions and grow storage of their
# own: allocations go on all the time (a fork the faults stop is only a
# cache miss), and 4 sessions for 8 clients make requests wait under
# --kv-budget. OG_BACKEND=cuda runs it on a GPU
# (tests/gpu/run.sh), where the faults hit cuMemCreate and cudaMallocAsync.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BACKEND=${OG_BACKEND:-cpu}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$SRC/tests/serve/server.sh"
# a longer context than the demo's 1,024, so that requests grow their storage;
# OG_FAULTS_MODEL: another checkpoint (tests/gpu/run.sh: wider KV rows, made by
# tests/serve/wide_kv_model.py, so that every request outgrows device chunks)
"$BIN" export "${OG_FAULTS_MODEL:-$SRC/models/kjv-tiny}" -o "$WORK/long.ogp" --max-context 4096 --force-max-context >"$WORK/export.log" 2>&1 ||
    { fail "export: $(cat "$WORK/export.log")"; exit 1; }

# the environment can change the requests' lengths, the fault rate and the
# server's options (tests/gpu/run.sh: one cuMemCreate backs 2 MiB of KV,
# which only longer requests outgrow)
TOKENS=${OG_FAULTS_TOKENS:-"100 200 300"}
ARGS=${OG_FAULTS_ARGS:-}
start_server ref -m "$WORK/long.ogp" --backend "$BACKEND" $ARGS || exit 1
timeout 300 python3 - "$PORT" "$WORK/ref.json" $TOKENS <<'PY' || fail "the references"
import http.client, json, sys
port, out, tokens = int(sys.argv[1]), sys.argv[2], [int(t) for t in sys.argv[3:]]
refs = []
# one long opening shared by every prompt: after the first, each request
# starts from a fork of a cached session and grows storage of its own
common = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
          "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. ")
for i, prompt in enumerate(["And God said", "And it came to pass", "The LORD is my shepherd", "Blessed are",
                            "Then spake Jesus", "And Moses said"]):
    req = {"prompt": common + prompt, "max_tokens": tokens[i % len(tokens)], "temperature": 0, "ignore_eos": True}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps(req), {"Content-Type": "application/json"})
    r = c.getresponse()
    j = json.loads(r.read())
    assert r.status == 200 and j["usage"]["completion_tokens"] == req["max_tokens"], j
    refs.append({"request": req, "text": j["choices"][0]["text"]})
json.dump(refs, open(out, "w"))
PY
kill -TERM $PID
wait $PID || fail "the reference server: exit status $?"
PID=

export OFFGRAPH_TEST_KV_FAIL_EVERY=${OG_FAULTS_EVERY:-6}
start_server faults -m "$WORK/long.ogp" --backend "$BACKEND" --max-sessions 4 --max-queue 64 \
    --kv-budget "${OG_FAULTS_KV_BUDGET:-16M}" $ARGS || exit 1
unset OFFGRAPH_TEST_KV_FAIL_EVERY
# OG_FAULTS_COUNT: fewer under the sanitizers (make test-sanitize), where requests are ten times slower
timeout 600 python3 "$SRC/tests/serve/faults.py" "$PORT" "$WORK/ref.json" 8 "${OG_FAULTS_COUNT:-100}" 400 ||
    fail "requests under faults (above)"
# afterwards: up and idle, nothing left (python, not curl: a GPU machine may lack it)
timeout 60 python3 - "$PORT" <<'PY' || fail "afterwards (above)"
import http.client, sys, time
port = int(sys.argv[1])
def get(path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()
for _ in range(100):
    m = dict(l.rsplit(" ", 1) for l in get("/metrics")[1].splitlines() if l and not l.startswith("#"))
    idle = all(m["offgraph_" + k] == "0" for k in ("requests_running", "requests_waiting", "sessions_busy",
                                                  "kv_bytes_live"))
    if idle:
        break
    time.sleep(0.1)
print("\n".join("%s %s" % kv for kv in m.items() if "requests_total" in kv[0] or "step_failures" in kv[0]))
assert idle, "a request, session or KV left: %s" % {k: v for k, v in m.items() if "running" in k or "busy" in k or "live" in k}
assert get("/health")[0] == 200
PY
kill -TERM $PID
wait $PID || fail "the server under faults: exit status $? after SIGTERM: $(tail -3 "$WORK/faults.log")"
PID=

[ $fails = 0 ] && echo "cli_serve_faults: all passed"
exit $((fails > 0))
