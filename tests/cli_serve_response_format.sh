#!/usr/bin/env bash
# offgraph serve's response_format over loopback, on the demo model: a chat
# and a completion under json_schema (greedy and sampled, streamed and not)
# give output that Debian's python3-jsonschema validates against the
# schema, with finish_reason "stop"; json_object gives a JSON object (or
# its start, cut at max_tokens); text
# is free; a schema with a keyword or string format the compiler does not
# support is a 400 naming it (param response_format), as is an unknown type.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
command -v curl >/dev/null || { echo "cli_serve_response_format: curl is missing: skipped"; exit 77; }
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
. "$SRC/tests/serve/server.sh"

post() { # PATH BODY: the body in $WORK/out, prints the status
    curl -s --max-time 120 -o "$WORK/out" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
        --data-binary "$2" "http://127.0.0.1:$PORT$1"
}

SCHEMA='{"type":"object","properties":{"name":{"type":"string","maxLength":20},"age":{"type":"integer"},"tribe":{"enum":["Judah","Levi"]},"sons":{"type":"array","items":{"type":"string","maxLength":10},"maxItems":2}},"required":["name","age","tribe","sons"],"additionalProperties":false}'
echo "$SCHEMA" >"$WORK/schema.json"

# check NAME: the text of the completion in $WORK/out (streamed or not) must validate
check() {
    local name=$1
    $PY - "$WORK/out" "$WORK/schema.json" "$name" <<'EOF'
import json, sys
import jsonschema
raw = open(sys.argv[1]).read()
schema = json.load(open(sys.argv[2]))
name = sys.argv[3]
if raw.startswith("data:"):  # a stream: join the deltas
    text, finish = "", None
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])["choices"]
        if not ch:
            continue
        c = ch[0]
        text += (c.get("delta") or {}).get("content") or c.get("text") or ""
        finish = c.get("finish_reason") or finish
else:
    c = json.loads(raw)["choices"][0]
    text = c["message"]["content"] if "message" in c else c["text"]
    finish = c["finish_reason"]
doc = json.loads(text)
jsonschema.Draft202012Validator(schema).validate(doc)
assert finish == "stop", finish
print(f"{name}: {text}")
EOF
}

start_server rf || exit 1
RF='"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":'"$SCHEMA"'}}'
for temp in 0 1; do
    st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Who begat whom?"}],"temperature":'$temp',"seed":7,'"$RF"'}')
    [ "$st" = 200 ] || fail "chat json_schema temperature $temp: status $st: $(cat "$WORK/out")"
    check "chat, temperature $temp" || fail "chat json_schema temperature $temp: $(cat "$WORK/out")"
    st=$(post /v1/completions '{"prompt":"And the LORD said","max_tokens":300,"stream":true,"temperature":'$temp',"seed":3,'"$RF"'}')
    [ "$st" = 200 ] || fail "completion json_schema stream temperature $temp: status $st"
    check "completion streamed, temperature $temp" || fail "completion stream temperature $temp: $(cat "$WORK/out")"
done
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Speak."}],"max_tokens":400,"response_format":{"type":"json_object"}}')
[ "$st" = 200 ] || fail "json_object: status $st"
# (this model rarely closes a free string: at max_tokens the text is a JSON object's start)
$PY -c "import json,sys; c=json.load(open('$WORK/out'))['choices'][0]; t=c['message']['content']
assert (c['finish_reason']=='length' and t.startswith('{')) or isinstance(json.loads(t), dict)" \
    || fail "json_object: not a JSON object: $(cat "$WORK/out")"
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Speak."}],"max_tokens":8,"response_format":{"type":"text"}}')
[ "$st" = 200 ] || fail "text: status $st"
# refusals name what is wrong
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"string","pattern":"^a"}}}}')
[ "$st" = 400 ] && grep -q '"param":"response_format"' "$WORK/out" && grep -q 'pattern' "$WORK/out" \
    || fail "unsupported keyword: status $st: $(cat "$WORK/out")"
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"string","format":"email"}}}}')
[ "$st" = 400 ] && grep -q 'email' "$WORK/out" || fail "unsupported format: status $st: $(cat "$WORK/out")"
st=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}')
[ "$st" = 400 ] && grep -q 'yaml' "$WORK/out" || fail "unknown type: status $st: $(cat "$WORK/out")"
kill -TERM $PID 2>/dev/null
wait $PID 2>/dev/null
PID=
[ $fails -eq 0 ] && echo "cli_serve_response_format: ok" || echo "cli_serve_response_format: $fails failures"
exit $((fails > 0))
