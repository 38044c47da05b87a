#!/usr/bin/env bash
# offgraph serve over loopback (ports picked by the kernel: --port 0), with
# curl for every endpoint and error: with no --host it listens on 127.0.0.1
# only, and no path reaches a file; /health, /v1/models, /metrics,
# completions and chat completions (streamed and not); greedy text over HTTP
# equals `offgraph run --temp 0`; stop strings; bad JSON, wrong types, an
# unknown model, n > 1, a prompt past the context, a body past the limit,
# unknown paths and methods; 32 concurrent streaming clients all get
# complete, correct streams; a client that hangs up mid-stream frees its
# session (/metrics); past --max-sessions / --kv-budget and the queue, 429
# with Retry-After, and later the same request succeeds; --api-key; SIGTERM
# exits 0. Every call has a timeout.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
SSE=$SRC/tests/serve/sse.py
rm -rf "$WORK" && mkdir -p "$WORK"
command -v curl >/dev/null || { echo "cli_serve: curl is missing: skipped"; exit 77; }
. "$SRC/tests/serve/server.sh"

# stop_server NAME: SIGTERM, and it must exit 0 within 20 s
stop_server() {
    kill -TERM $PID 2>/dev/null
    for _ in $(seq 200); do
        kill -0 $PID 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 $PID 2>/dev/null; then
        fail "$1: still running 20 s after SIGTERM"
        kill -9 $PID
    fi
    wait $PID
    local rc=$?
    [ $rc -eq 0 ] || fail "$1: exit status $rc after SIGTERM: $(tail -3 "$WORK/$1.log")"
}

# req METHOD PATH [BODY] [curl args]: writes the body to $WORK/out, prints the status
req() {
    local method=$1 path=$2 body=${3:-}
    shift 3 2>/dev/null || shift $#
    if [ -n "$body" ]; then
        curl -s --max-time 60 -o "$WORK/out" -w '%{http_code}' -X "$method" -H 'Content-Type: application/json' \
            --data-binary "$body" "$@" "http://127.0.0.1:$PORT$path"
    else
        curl -s --max-time 60 -o "$WORK/out" -w '%{http_code}' -X "$method" "$@" "http://127.0.0.1:$PORT$path"
    fi
}

# json EXPR: evaluates a Python expression over j = the JSON in $WORK/out
json() { python3 -c "import json,sys; j=json.load(open('$WORK/out')); sys.exit(0 if ($1) else 1)" 2>/dev/null; }
jget() { python3 -c "import json; j=json.load(open('$WORK/out')); print($1)"; }

# expect_error STATUS CODE_OR_PARAM_CHECK DESC METHOD PATH BODY
expect_error() {
    local want=$1 check=$2 desc=$3
    shift 3
    local got
    got=$(req "$@")
    [ "$got" = "$want" ] || { fail "$desc: HTTP $got, not $want: $(head -c 300 "$WORK/out")"; return; }
    json "isinstance(j['error']['message'], str) and j['error']['type'] and ($check)" ||
        fail "$desc: not an OpenAI error object: $(head -c 300 "$WORK/out")"
}

# ------------------------------------------------------------ server A: defaults, the demo model
start_server a --max-body 65536 --backend cpu || exit 1
# the CPU back end's default admission: 64 requests at once, 256 waiting
grep -q "listening on http://127.0.0.1:$PORT (64 requests at once, 256 may wait)" "$WORK/a.log" ||
    fail "default --max-sessions on the CPU: $(grep listening "$WORK/a.log")"

# with no --host it listens on loopback only: 127.0.0.1:PORT, not every address (IPv4 or IPv6)
hexport=$(printf '%04X' "$PORT")
grep -q "^ *[0-9]*: 0100007F:$hexport 00000000:0000 0A" /proc/net/tcp ||
    fail "default --host: no socket listening on 127.0.0.1:$PORT"
! grep -q "^ *[0-9]*: 00000000:$hexport 00000000:0000 0A" /proc/net/tcp ||
    fail "default --host: listening on every IPv4 address"
! grep -q "^ *[0-9]*: 0\{32\}:$hexport 0\{32\}:0000 0A" /proc/net/tcp6 2>/dev/null ||
    fail "default --host: listening on every IPv6 address"
# no endpoint reaches a file of the server's: paths that try are unknown endpoints or models
for path in /../../etc/passwd /v1/../../etc/passwd /v1/models/../../../etc/passwd "/v1/models/%2e%2e%2fetc%2fpasswd" \
    /static/../../etc/passwd /v1/files /v1/files/x; do
    code=$(curl -s --path-as-is --max-time 10 -o "$WORK/out" -w '%{http_code}' "http://127.0.0.1:$PORT$path")
    [ "$code" = 404 ] && ! grep -q "root:" "$WORK/out" || fail "GET $path: HTTP $code: $(head -c 200 "$WORK/out")"
done

[ "$(req GET /health)" = 200 ] && json "j['status'] == 'ok'" || fail "/health: $(cat "$WORK/out")"
[ "$(req GET /v1/models)" = 200 ] && json "j['object'] == 'list' and j['data'][0]['id'] == 'kjv-tiny'" ||
    fail "/v1/models: $(cat "$WORK/out")"
[ "$(req GET /v1/models/kjv-tiny)" = 200 ] && json "j['id'] == 'kjv-tiny'" || fail "/v1/models/kjv-tiny"
[ "$(req GET /metrics)" = 200 ] && grep -q '^offgraph_requests_running 0' "$WORK/out" &&
    grep -q '^offgraph_kv_bytes_backed' "$WORK/out" || fail "/metrics: $(head -c 300 "$WORK/out")"

# greedy over HTTP equals offgraph run --temp 0
i=0
for prompt in "In the beginning" "And it came to pass" "The LORD is my shepherd"; do
    i=$((i + 1))
    want=$("$BIN" run -p "$prompt" -n 24 --temp 0 2>/dev/null)
    body=$(python3 -c 'import json,sys; print(json.dumps({"model": "kjv-tiny", "prompt": sys.argv[1], "max_tokens": 24, "temperature": 0}))' "$prompt")
    st=$(req POST /v1/completions "$body")
    [ "$st" = 200 ] || { fail "completion $i: HTTP $st $(cat "$WORK/out")"; continue; }
    json "j['object'] == 'text_completion' and j['usage']['completion_tokens'] <= 24 and j['usage']['total_tokens'] == j['usage']['prompt_tokens'] + j['usage']['completion_tokens'] and j['choices'][0]['finish_reason'] in ('stop', 'length')" ||
        fail "completion $i: fields: $(cat "$WORK/out")"
    got="$prompt$(jget "j['choices'][0]['text']")"
    [ "$got" = "$want" ] || fail "completion $i: HTTP greedy != run --temp 0:
  http: $got
  run:  $want"
    # the same streamed: the pieces add up to the same text, framed as SSE
    sbody=$(python3 -c 'import json,sys; b=json.loads(sys.argv[1]); b["stream"]=True; print(json.dumps(b))' "$body")
    curl -sN --max-time 60 -H 'Content-Type: application/json' -d "$sbody" \
        "http://127.0.0.1:$PORT/v1/completions" >"$WORK/stream.$i"
    sgot=$(python3 "$SSE" check-stream "$WORK/stream.$i") || fail "stream $i: framing: $(head -c 400 "$WORK/stream.$i")"
    [ "$prompt$sgot" = "$want" ] || fail "stream $i: streamed text differs: $sgot"
done

# stop strings: the text ends just before the first stop string
full=$(python3 -c "import json; print(json.load(open('$WORK/out'))['choices'][0]['text'])")
stopword=$(python3 -c 'import sys; w=sys.argv[1].split(); print(" " + w[len(w)//2])' "$full")
body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": "The LORD is my shepherd", "max_tokens": 24, "temperature": 0, "stop": [sys.argv[1], "zzzz"]}))' "$stopword")
[ "$(req POST /v1/completions "$body")" = 200 ] || fail "stop: $(cat "$WORK/out")"
python3 - "$WORK/out" "$full" "$stopword" <<'PY' || fail "stop strings: $(cat "$WORK/out")"
import json, sys
j = json.load(open(sys.argv[1])); full, stop = sys.argv[2], sys.argv[3]
assert j["choices"][0]["text"] == full[:full.index(stop)], (j["choices"][0]["text"], full, stop)
assert j["choices"][0]["finish_reason"] == "stop"
PY

# chat completions, streamed and not, with sampling fields and logprobs
body='{"model":"kjv-tiny","messages":[{"role":"system","content":"Speak plainly."},{"role":"user","content":"And God said"}],"max_tokens":12,"temperature":0.7,"top_p":0.9,"top_k":20,"min_p":0.01,"seed":5,"logprobs":true,"top_logprobs":3}'
[ "$(req POST /v1/chat/completions "$body")" = 200 ] || fail "chat: $(cat "$WORK/out")"
json "j['object'] == 'chat.completion' and j['choices'][0]['message']['role'] == 'assistant' and j['usage']['completion_tokens'] >= 1 and len(j['choices'][0]['logprobs']['content']) == j['usage']['completion_tokens'] and len(j['choices'][0]['logprobs']['content'][0]['top_logprobs']) == 3" ||
    fail "chat: fields: $(cat "$WORK/out")"
first=$(jget "j['choices'][0]['message']['content']")
[ "$(req POST /v1/chat/completions "$body")" = 200 ] && [ "$(jget "j['choices'][0]['message']['content']")" = "$first" ] ||
    fail "chat: the same seed gave another reply"
curl -sN --max-time 60 -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"And God said"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}' \
    "http://127.0.0.1:$PORT/v1/chat/completions" >"$WORK/chat.stream"
python3 "$SSE" check-stream "$WORK/chat.stream" >/dev/null || fail "chat stream: $(head -c 400 "$WORK/chat.stream")"
grep -q '"delta":{"role":"assistant"' "$WORK/chat.stream" || fail "chat stream: no role delta"
grep -q '"choices":\[\],"usage"' "$WORK/chat.stream" || fail "chat stream: no include_usage chunk"
[ "$(grep -c '"usage":{' "$WORK/chat.stream")" = 1 ] || fail "chat stream: usage more than once: $(cat "$WORK/chat.stream")"
# completions with logprobs and token ids as the prompt
[ "$(req POST /v1/completions '{"prompt":[5,6,7],"max_tokens":3,"logprobs":2,"temperature":0}')" = 200 ] &&
    json "len(j['choices'][0]['logprobs']['tokens']) == 3 and j['usage']['prompt_tokens'] == 3" ||
    fail "token-id prompt with logprobs: $(cat "$WORK/out")"

# logit_bias, presence_penalty and frequency_penalty reach the sampler
and_id=$("$BIN" tokenize -p " and" 2>/dev/null)
case "$and_id" in
*" "* | "") fail "logit_bias: ' and' is not one token here: '$and_id'" ;;
*)
    [ "$(req POST /v1/completions '{"prompt":"In the beginning","max_tokens":5,"temperature":0,"logit_bias":{"'"$and_id"'":100}}')" = 200 ] &&
        json "j['choices'][0]['text'] == ' and' * 5" || fail "logit_bias +100: $(cat "$WORK/out")"
    [ "$(req POST /v1/chat/completions '{"messages":[{"role":"user","content":"And God said"}],"max_tokens":4,"temperature":0.9,"seed":4,"logit_bias":{"'"$and_id"'":100}}')" = 200 ] &&
        json "j['choices'][0]['message']['content'] == ' and' * 4" || fail "chat logit_bias +100: $(cat "$WORK/out")"
    ;;
esac
[ "$(req POST /v1/completions '{"prompt":"And it came to pass","max_tokens":32,"temperature":0}')" = 200 ] || fail "greedy: $(cat "$WORK/out")"
plain=$(jget "j['choices'][0]['text']")
[ "$(req POST /v1/completions '{"prompt":"And it came to pass","max_tokens":32,"temperature":0,"presence_penalty":2,"frequency_penalty":2}')" = 200 ] ||
    fail "penalties: $(cat "$WORK/out")"
[ "$(jget "j['choices'][0]['text']")" != "$plain" ] || fail "presence_penalty and frequency_penalty changed nothing in: $plain"
expect_error 400 "j['error']['param'] == 'logit_bias'" "logit_bias key not an id" POST /v1/completions '{"prompt":"x","logit_bias":{"the":5}}'
expect_error 400 "j['error']['param'] == 'logit_bias'" "logit_bias id past the vocabulary" POST /v1/completions '{"prompt":"x","logit_bias":{"99999999":5}}'
expect_error 400 "j['error']['param'] == 'logit_bias'" "logit_bias 101" POST /v1/completions '{"prompt":"x","logit_bias":{"5":101}}'
expect_error 400 "j['error']['param'] == 'presence_penalty'" "presence_penalty 3" POST /v1/completions '{"prompt":"x","presence_penalty":3}'
# n choices (one prefill, forked), prompt arrays, and streamed choices carrying their index
[ "$(req POST /v1/completions '{"prompt":"In the beginning","max_tokens":8,"temperature":0}')" = 200 ] || fail "n=1: $(cat "$WORK/out")"
cp "$WORK/out" "$WORK/one.json"
one_prompt=$(jget "j['usage']['prompt_tokens']")
one_completion=$(jget "j['usage']['completion_tokens']")
[ "$(req POST /v1/completions '{"prompt":"In the beginning","max_tokens":8,"temperature":0,"n":3}')" = 200 ] &&
    json "[c['index'] for c in j['choices']] == [0, 1, 2] and all(c['text'] == json.load(open('$WORK/one.json'))['choices'][0]['text'] for c in j['choices']) and j['usage']['prompt_tokens'] == $one_prompt and j['usage']['completion_tokens'] == 3 * $one_completion" ||
    fail "n=3 greedy: $(cat "$WORK/out")"
[ "$(req POST /v1/completions '{"prompt":["In the beginning",[5,6,7]],"max_tokens":6,"temperature":0.9,"seed":5,"n":2}')" = 200 ] &&
    json "[c['index'] for c in j['choices']] == [0, 1, 2, 3] and j['usage']['prompt_tokens'] == $one_prompt + 3 and j['usage']['total_tokens'] == j['usage']['prompt_tokens'] + j['usage']['completion_tokens']" ||
    fail "a prompt array with n=2: $(cat "$WORK/out")"
curl -sN --max-time 60 -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"And God said"}],"max_tokens":6,"n":3,"temperature":1,"seed":9,"stream":true,"stream_options":{"include_usage":true}}' \
    "http://127.0.0.1:$PORT/v1/chat/completions" >"$WORK/chat_n.stream"
python3 - "$WORK/chat_n.stream" <<'PY' || fail "chat stream n=3: $(head -c 600 "$WORK/chat_n.stream")"
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert ev[-1] == "[DONE]", ev[-1:]
ev = [json.loads(e) for e in ev[:-1]]
fin = {}
text = {0: "", 1: "", 2: ""}
for e in ev[:-1]:
    assert e["usage"] is None and len(e["choices"]) == 1, e
    c = e["choices"][0]
    text[c["index"]] += c["delta"].get("content") or ""
    if c["finish_reason"]:
        assert c["index"] not in fin, ("two ends", c)
        fin[c["index"]] = c["finish_reason"]
assert sorted(fin) == [0, 1, 2], fin
assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] >= 3, ev[-1]
PY
expect_error 400 "j['error']['param'] == 'n'" "n past max_sessions" POST /v1/completions '{"prompt":"x","n":100}'
expect_error 400 "j['error']['param'] == 'n'" "n 0" POST /v1/completions '{"prompt":"x","n":0}'
expect_error 400 "j['error']['param'] == 'functions'" "functions" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"functions":[]}'

# errors, each an OpenAI error object
long=$(python3 -c 'print("And it came to pass " * 400)')
expect_error 400 "True" "malformed JSON" POST /v1/completions '{"prompt": "x",'
expect_error 400 "j['error']['param'] == 'temperature'" "temperature as a string" POST /v1/completions '{"prompt":"x","temperature":"hot"}'
expect_error 400 "j['error']['param'] == 'max_tokens'" "max_tokens as a float" POST /v1/completions '{"prompt":"x","max_tokens":1.5}'
expect_error 400 "j['error']['param'] == 'stop'" "stop as a number" POST /v1/completions '{"prompt":"x","stop":3}'
expect_error 400 "j['error']['param'] == 'prompt'" "no prompt" POST /v1/completions '{"max_tokens":3}'
expect_error 400 "j['error']['param'] == 'max_tokens'" "max_tokens 0" POST /v1/completions '{"prompt":"x","max_tokens":0}'
expect_error 400 "j['error']['param'] == 'max_completion_tokens'" "max_completion_tokens 0" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0}'
# every field is read or refused by name: OpenAI's that offgraph does not implement, and unknown ones
expect_error 400 "j['error']['param'] == 'suffix'" "suffix" POST /v1/completions '{"prompt":"x","suffix":"end"}'
expect_error 400 "j['error']['param'] == 'best_of'" "best_of 3" POST /v1/completions '{"prompt":"x","best_of":3}'
expect_error 400 "j['error']['param'] == 'echo'" "echo" POST /v1/completions '{"prompt":"x","echo":true}'
expect_error 400 "j['error']['param'] == 'audio'" "audio" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"audio":{"voice":"alloy","format":"wav"}}'
expect_error 400 "j['error']['param'] == 'modalities'" "modalities audio" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"modalities":["text","audio"]}'
expect_error 400 "j['error']['param'] == 'store'" "store true" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"store":true}'
expect_error 400 "j['error']['param'] == 'prediction'" "prediction" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"prediction":{"type":"content","content":"x"}}'
expect_error 400 "j['error']['param'] == 'reasoning_effort'" "reasoning_effort" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"low"}'
expect_error 400 "j['error']['param'] == 'web_search_options'" "web_search_options" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"web_search_options":{}}'
expect_error 400 "j['error']['param'] == 'service_tier'" "service_tier flex" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"x"}],"service_tier":"flex"}'
expect_error 400 "j['error']['param'] == 'temprature'" "a misspelt field" POST /v1/completions '{"prompt":"x","temprature":0}'
expect_error 400 "j['error']['param'] == 'messages'" "messages on completions" POST /v1/completions \
    '{"prompt":"x","messages":[]}'
expect_error 400 "j['error']['param'] == 'stream_options'" "stream_options without stream" POST /v1/completions \
    '{"prompt":"x","stream_options":{"include_usage":true}}'
expect_error 400 "j['error']['param'] == 'stream_options'" "an unknown stream option" POST /v1/completions \
    '{"prompt":"x","stream":true,"stream_options":{"include_everything":true}}'
# the fields that change nothing in an answer are taken
[ "$(req POST /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"user":"u1","store":false,"metadata":{"k":"v"},"modalities":["text"],"service_tier":"auto","prompt_cache_key":"p","safety_identifier":"s"}')" = 200 ] ||
    fail "chat with the fields that change nothing: $(cat "$WORK/out")"
[ "$(req POST /v1/completions '{"prompt":"x","max_tokens":2,"user":"u1","best_of":1,"echo":false,"suffix":""}')" = 200 ] ||
    fail "completion with the fields that change nothing: $(cat "$WORK/out")"
expect_error 400 "j['error']['param'] == 'messages'" "chat without messages" POST /v1/chat/completions '{"max_tokens":3}'
expect_error 400 "True" "a role nobody knows" POST /v1/chat/completions '{"messages":[{"role":"wizard","content":"x"}]}'
expect_error 400 "True" "a body that is not an object" POST /v1/completions '[1,2]'
expect_error 404 "j['error']['code'] == 'model_not_found'" "unknown model" POST /v1/completions '{"model":"gpt-9","prompt":"x"}'
expect_error 404 "j['error']['code'] == 'model_not_found'" "unknown model id" GET /v1/models/gpt-9
expect_error 400 "j['error']['code'] == 'context_length_exceeded' and '1024' in j['error']['message']" \
    "a prompt past the context" POST /v1/completions "{\"prompt\":\"$long\"}"
expect_error 413 "j['error']['code'] == 'request_too_large'" "a body past --max-body" POST /v1/completions \
    "{\"prompt\":\"$long$long$long$long$long$long$long$long$long\"}"
# one declared more than 8 times past it is answered before it is sent
# (the client waits for 100 Continue), the rest read and dropped first
python3 -c "import sys; sys.stdout.write('{\"prompt\":\"' + 'x' * 600000 + '\"}')" >"$WORK/big.json"
expect_error 413 "j['error']['code'] == 'request_too_large'" "a body far past --max-body" POST /v1/completions \
    "@$WORK/big.json" -H 'Expect: 100-continue'
expect_error 404 "True" "unknown path" GET /v1/nothing
expect_error 405 "True" "GET on completions" GET /v1/completions

# a request that ends at the context: finish_reason length, no error
[ "$(req POST /v1/completions '{"prompt":"And it came to pass","max_tokens":5000,"temperature":0}')" = 200 ] &&
    json "j['choices'][0]['finish_reason'] in ('length', 'stop') and j['usage']['total_tokens'] <= 1025" ||
    fail "max_tokens past the context: $(head -c 300 "$WORK/out")"

# 32 concurrent streaming clients, each text equal to its greedy text alone
timeout 300 python3 - "$PORT" "$WORK/expect.json" <<'PY' || fail "expected texts for the concurrent clients"
import http.client, json, sys
port, out = int(sys.argv[1]), sys.argv[2]
words = ["beginning", "king", "LORD", "people", "land", "house", "son", "day"]
exp = []
for i in range(32):
    prompt = "And the %s of the %s" % (words[i % 8], words[(i * 3 + 1) % 8])
    n = 8 + (i * 5) % 17
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0}))
    j = json.loads(c.getresponse().read())
    exp.append({"prompt": prompt, "max_tokens": n, "text": j["choices"][0]["text"],
                "completion_tokens": j["usage"]["completion_tokens"]})
json.dump(exp, open(out, "w"))
PY
timeout 200 python3 "$SSE" concurrent "$PORT" 32 "$WORK/expect.json" || fail "32 concurrent streams"

# a client that hangs up mid-stream: its request is cancelled, its session freed
before=$(curl -s --max-time 10 "http://127.0.0.1:$PORT/metrics" | sed -n 's/^offgraph_requests_total{outcome="cancelled"} //p')
timeout 60 python3 "$SSE" disconnect "$PORT" >/dev/null || fail "disconnect client"
ok=0
for _ in $(seq 100); do
    m=$(curl -s --max-time 10 "http://127.0.0.1:$PORT/metrics")
    if echo "$m" | grep -q '^offgraph_requests_running 0$' && echo "$m" | grep -q '^offgraph_sessions_busy 0$' &&
        [ "$(echo "$m" | sed -n 's/^offgraph_requests_total{outcome="cancelled"} //p')" = $((before + 1)) ]; then
        ok=1
        break
    fi
    sleep 0.1
done
[ $ok = 1 ] || fail "a hung-up stream was not cancelled and freed: $(echo "$m" | grep -v '^#')"
stop_server a

# ------------------------------------------------------------ server B: admission, 429, queue
# a budget for one 200-token request at a time (one session's first 256
# rows and its rings: 638208 bytes), and no queue
start_server b --max-sessions 4 --kv-budget 1M --max-queue 0 || exit 1
expect_error 400 "'kv_budget' in j['error']['message']" "a request larger than the whole budget" POST /v1/completions \
    '{"prompt":"x","max_tokens":1000}'
timeout 300 python3 - "$PORT" >"$WORK/b.out" <<'PY' || fail "429 under the budget: $(cat "$WORK/b.out")"
import http.client, json, sys, threading
port = int(sys.argv[1])
res = []
def one():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"prompt": "And it came to pass", "max_tokens": 200, "temperature": 0}))
    r = c.getresponse()
    res.append((r.status, r.getheader("Retry-After"), json.loads(r.read())))
ts = [threading.Thread(target=one) for _ in range(6)]
for t in ts: t.start()
for t in ts: t.join(120)
codes = sorted(s for s, _, _ in res)
print(codes)
assert len(res) == 6 and 200 in codes and 429 in codes, codes
for s, ra, j in res:
    if s == 429:
        assert ra and int(ra) >= 1 and j["error"]["code"] == "rate_limit_exceeded", (ra, j)
# later, the same request succeeds
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
c.request("POST", "/v1/completions", json.dumps({"prompt": "And it came to pass", "max_tokens": 200, "temperature": 0}))
assert c.getresponse().status == 200
PY
stop_server b

# one session and a queue: every request waits its turn and succeeds
start_server c --max-sessions 1 --max-queue 8 || exit 1
timeout 300 python3 - "$PORT" >"$WORK/c.out" <<'PY' || fail "queued requests: $(cat "$WORK/c.out")"
import http.client, json, sys, threading
port = int(sys.argv[1])
res = []
def one(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"prompt": "And God said", "max_tokens": 40, "seed": i}))
    res.append(c.getresponse().status)
ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
for t in ts: t.start()
for t in ts: t.join(120)
print(res)
assert res == [200] * 6, res
PY
stop_server c

# ------------------------------------------------------------ server D: --api-key
start_server d --api-key s3cret || exit 1
[ "$(req GET /health)" = 200 ] || fail "auth: /health needs no key"
expect_error 401 "j['error']['code'] == 'invalid_api_key'" "auth: no key" GET /v1/models
expect_error 401 "True" "auth: wrong key" GET /v1/models "" -H "Authorization: Bearer nope"
expect_error 401 "True" "auth: no key on completions" POST /v1/completions '{"prompt":"x","max_tokens":2}'
[ "$(req GET /metrics "" -H "Authorization: Bearer nope")" = 401 ] || fail "auth: /metrics with a wrong key"
[ "$(req GET /v1/models "" -H "Authorization: Bearer s3cret")" = 200 ] || fail "auth: the right key"
[ "$(req POST /v1/completions '{"prompt":"x","max_tokens":2}' -H "Authorization: Bearer s3cret")" = 200 ] ||
    fail "auth: completions with the right key: $(cat "$WORK/out")"
stop_server d

# ------------------------------------------------------------ SIGINT mid-stream: the stream ends, exit 0
start_server e --shutdown-grace 0 || exit 1
curl -sN --max-time 30 -d '{"prompt":"And it came to pass","max_tokens":100000,"stream":true}' \
    "http://127.0.0.1:$PORT/v1/completions" >"$WORK/e.stream" &
cpid=$!
# the stream has begun (on a loaded machine curl may take a while to connect)
for _ in $(seq 100); do [ -s "$WORK/e.stream" ] && break; sleep 0.1; done
kill -INT $PID
wait $cpid
for _ in $(seq 200); do kill -0 $PID 2>/dev/null || break; sleep 0.1; done
wait $PID
rc=$?
[ $rc -eq 0 ] || fail "SIGINT: exit status $rc"
tail -c 200 "$WORK/e.stream" | grep -q 'data: \[DONE\]' || fail "SIGINT: the open stream did not end with [DONE]: $(tail -c 300 "$WORK/e.stream")"

[ $fails -eq 0 ] && echo "cli_serve: all passed"
exit $((fails > 0))
