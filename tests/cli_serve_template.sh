#!/usr/bin/env bash
# offgraph serve renders chat completions with the model's own Jinja chat
# template: a checkpoint given Gemma's template answers a conversation
# without a system message and refuses one with it (400, the template's
# raise_exception message); given Qwen3's, chat_template_kwargs
# {"enable_thinking": false} reaches the template (the prompt grows by the
# empty think block it then adds) and a non-boolean value is refused.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
. "$SRC/tests/serve/server.sh"
# post(body) -> (HTTP status, JSON) for the chat completions of the server on port argv[1]
cat >"$WORK/post.py" <<'PY'
import json, sys, urllib.request, urllib.error
url = "http://127.0.0.1:%s/v1/chat/completions" % sys.argv[1]
def post(body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
PY

serve_with() { # template name: exports, starts the server, sets PID and PORT
    mkdir -p "$WORK/$1"
    cp "$SRC/tests/data/hf/qwen3-mixed/"* "$WORK/$1/"
    cp "$SRC/tests/data/chat_templates/$1.jinja" "$WORK/$1/chat_template.jinja"
    "$BIN" export "$WORK/$1" -o "$WORK/$1.ogp" 2>/dev/null || { fail "$1: export"; return 1; }
    start_server "$1" -m "$WORK/$1.ogp"
}
stop() {
    kill -TERM $PID
    wait $PID || fail "the server's exit status after SIGTERM"
}

if serve_with gemma; then
    python3 - "$PORT" "$WORK" <<'PY' || fail "gemma template"
import sys
sys.path.insert(0, sys.argv[2])
from post import post
st, r = post({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3})
assert st == 200 and r["usage"]["prompt_tokens"] > 0, (st, r)
st, r = post({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
              "max_tokens": 3})
assert st == 400 and "System role not supported" in r["error"]["message"], (st, r)
st, r = post({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "max_tokens": 3})
assert st == 400 and "roles must alternate" in r["error"]["message"], (st, r)
PY
    stop
fi

if serve_with qwen3; then
    python3 - "$PORT" "$WORK" <<'PY' || fail "qwen3 template"
import sys
sys.path.insert(0, sys.argv[2])
from post import post
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
st, on = post({"messages": msgs, "max_tokens": 2})
assert st == 200, (st, on)
st, off = post({"messages": msgs, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False}})
assert st == 200, (st, off)
# thinking off: the template adds "<think>\n\n</think>\n\n" after the assistant header
assert off["usage"]["prompt_tokens"] > on["usage"]["prompt_tokens"], (on["usage"], off["usage"])
st, r = post({"messages": msgs, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": "no"}})
assert st == 400 and r["error"]["param"] == "chat_template_kwargs", (st, r)
PY
    stop
fi

[ $fails -eq 0 ] && echo "cli_serve_template: all passed"
exit $((fails > 0))
