#!/usr/bin/env bash
# offgraph serve's tool calls: the qwen3-mixed checkpoint given Qwen3's chat
# template (which takes tools and writes <tool_call> blocks) is served and
# the `openai` npm client (tests/serve/openai_tools.mjs) asks for calls,
# streamed and not, sends them back with their results, and checks the
# refusals; every call's arguments validate against its function's
# parameters (Debian's python3-jsonschema). Then the demo model, whose
# template takes no tools, refuses tools (400, param tools) but takes
# tool_choice "none" and a conversation with tool results. Llama 3.1's and
# Mistral Nemo's templates, on the same checkpoint, give calls in their own
# formats (required and named, streamed and not) and take them back.
# Skipped (77)
# only where npm or node is absent.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
if ! command -v npm >/dev/null || ! command -v node >/dev/null || ! command -v curl >/dev/null; then
    echo "cli_serve_tools: npm, node or curl is missing: skipped"
    exit 77
fi
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
. "$SRC/tests/serve/server.sh"
# the client, as tests/cli_serve_openai.sh installs it (shared with it)
CLIENT=$(dirname "$WORK")/openai-client
if [ ! -f "$CLIENT/node_modules/openai/package.json" ]; then
    mkdir -p "$CLIENT"
    [ -f "$CLIENT/package.json" ] || echo '{"name": "offgraph-serve-test", "private": true}' >"$CLIENT/package.json"
    timeout 600 npm install --prefix "$CLIENT" --no-audit --no-fund --loglevel=error openai@4 >"$WORK/npm.log" 2>&1 || {
        echo "FAIL: npm install openai: $(tail -5 "$WORK/npm.log")"
        exit 1
    }
fi

# the tools (tests/data/tools/weather_add.json): enums, integers and a
# bounded string, so that a model of random weights still ends its calls
# within max_tokens
cp "$SRC/tests/data/tools/weather_add.json" "$WORK/tools.json"

# a pause after every step (a bigger model's step time), so that a stream
# reads each token of a call's arguments as it comes: more than one delta
export OFFGRAPH_TEST_STEP_DELAY_MS=5
mkdir -p "$WORK/m"
cp "$SRC/tests/data/hf/qwen3-mixed/"* "$WORK/m/"
cp "$SRC/tests/data/chat_templates/qwen3.jinja" "$WORK/m/chat_template.jinja"
# the tools' system prompt is long: a context past the checkpoint's 256
"$BIN" export "$WORK/m" -o "$WORK/m.ogp" --max-context 4096 --force-max-context >"$WORK/export.log" 2>&1 \
    || { echo "FAIL: export: $(cat "$WORK/export.log")"; exit 1; }
if start_server qwen3 -m "$WORK/m.ogp"; then
    timeout 300 node "$SRC/tests/serve/openai_tools.mjs" "$PORT" "$CLIENT" "$WORK" || fail "the openai client"
    $PY - "$WORK/tools.json" "$WORK/calls.json" <<'PY' || fail "the calls' arguments against their schemas"
import json, sys
import jsonschema
tools = {t["function"]["name"]: t["function"]["parameters"] for t in json.load(open(sys.argv[1]))}
calls = json.load(open(sys.argv[2]))
assert len(calls) >= 4, calls
for name, args in calls:
    jsonschema.Draft202012Validator(tools[name]).validate(args)
print("cli_serve_tools: %d calls valid: %s" % (len(calls), json.dumps(calls)[:300]))
PY
    kill -TERM $PID
    wait $PID || fail "the server's exit status after SIGTERM"
    PID=
fi

# Llama 3.1's and Mistral Nemo's templates: their own call formats, with
# the calls sent back in a second turn (Mistral's template takes only ids
# of 9 letters and digits)
for tpl in llama-3.1 mistral-nemo; do
    mkdir -p "$WORK/$tpl"
    cp "$SRC/tests/data/hf/qwen3-mixed/"* "$WORK/$tpl/"
    cp "$SRC/tests/data/chat_templates/$tpl.jinja" "$WORK/$tpl/chat_template.jinja"
    "$BIN" export "$WORK/$tpl" -o "$WORK/$tpl.ogp" --max-context 4096 --force-max-context >"$WORK/export.log" 2>&1 \
        || { fail "$tpl: export: $(cat "$WORK/export.log")"; continue; }
    start_server "$tpl" -m "$WORK/$tpl.ogp" || continue
    $PY - "$PORT" "$WORK/tools.json" "$tpl" <<'PY' || fail "$tpl"
import json, sys, urllib.request, urllib.error
import jsonschema
port, tools, tpl = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
def post(body, stream=False):
    req = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % port, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, (r.read().decode() if stream else json.load(r))
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
for choice in ("required", {"type": "function", "function": {"name": "add"}}):
    body = {"messages": msgs, "tools": tools, "tool_choice": choice, "parallel_tool_calls": False,
            "max_tokens": 300, "temperature": 0}
    st, r = post(body)
    assert st == 200, (st, r)
    c = r["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None, c
    calls = c["message"]["tool_calls"]
    assert len(calls) == 1, calls
    for call in calls:
        jsonschema.Draft202012Validator(schemas[call["function"]["name"]]).validate(
            json.loads(call["function"]["arguments"]))
    if isinstance(choice, dict):
        assert calls[0]["function"]["name"] == "add", calls
    # streamed: the same call, a first delta naming it, then its arguments
    # in pieces that join into the whole reply's
    st, raw = post(dict(body, stream=True), stream=True)
    deltas = [json.loads(l[6:]) for l in raw.splitlines() if l.startswith("data: {")]
    got = [tc for d in deltas for ch in d["choices"] for tc in (ch["delta"].get("tool_calls") or [])]
    fins = [ch["finish_reason"] for d in deltas for ch in d["choices"] if ch["finish_reason"]]
    first, rest = got[0], got[1:]
    assert first["index"] == 0 and first["type"] == "function" and first["id"] and \
        first["function"]["arguments"] == "", raw
    assert all(set(g) == {"index", "function"} and set(g["function"]) == {"arguments"} and g["index"] == 0
               for g in rest), raw
    streamed = [(first["function"]["name"], "".join(g["function"]["arguments"] for g in rest))]
    assert streamed == [(x["function"]["name"], x["function"]["arguments"]) for x in calls] and \
        fins == ["tool_calls"], raw
    assert len(calls[0]["function"]["arguments"]) < 8 or len(rest) > 1, raw
    # a second turn with the call and its result
    turn2 = msgs + [c["message"]] + [{"role": "tool", "tool_call_id": x["id"], "content": "18"} for x in calls]
    st, r2 = post({"messages": turn2, "tools": tools, "max_tokens": 4})
    assert st == 200 and r2["usage"]["prompt_tokens"] > r["usage"]["prompt_tokens"], (st, r2)
print("cli_serve_tools: %s: calls, streamed calls and a second turn ok" % tpl)
PY
    kill -TERM $PID
    wait $PID || fail "$tpl: the server's exit status after SIGTERM"
    PID=
done

unset OFFGRAPH_TEST_STEP_DELAY_MS

# the demo model's template takes no tools
post() { # BODY: the body in $WORK/out, prints the status
    curl -s --max-time 120 -o "$WORK/out" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
        --data-binary "$1" "http://127.0.0.1:$PORT/v1/chat/completions"
}
if start_server demo; then
    T=$(tr -d '\n' <"$WORK/tools.json")
    st=$(post '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"tools":'"$T"'}')
    [ "$st" = 400 ] && grep -q '"param":"tools"' "$WORK/out" && grep -q 'does not take tools' "$WORK/out" \
        || fail "tools on a template without them: status $st: $(cat "$WORK/out")"
    st=$(post '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"tools":'"$T"',"tool_choice":"none"}')
    [ "$st" = 200 ] || fail "tool_choice none: status $st: $(cat "$WORK/out")"
    st=$(post '{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"add","arguments":"{\"a\":1,\"b\":2}"}}]},{"role":"tool","tool_call_id":"c1","content":"3"}],"max_tokens":4}')
    [ "$st" = 200 ] || fail "tool results without tools: status $st: $(cat "$WORK/out")"
    kill -TERM $PID
    wait $PID || fail "the demo server's exit status after SIGTERM"
    PID=
fi
[ $fails -eq 0 ] && echo "cli_serve_tools: ok" || echo "cli_serve_tools: $fails failures"
exit $((fails > 0))
