#!/usr/bin/env bash
# Tool calls in the Python binding's Llama-style API
# (tests/python/check_tools.py says what it checks): the qwen3-mixed
# checkpoint exported with Qwen3's, Llama 3.1's and Mistral Nemo's chat
# templates (each writes calls in its own format), each also served by
# `offgraph serve` so that the same requests are compared with the server's
# answers; then the refusals, with the demo model (its template takes no
# tools) and a template that reads tools but writes calls in no format
# offgraph parses. The package runs from the source tree against this
# build's liboffgraph.so (tests/cli_python.sh checks the installed wheel).
# Needs Debian's python3 with python3-jsonschema (skipped, 77, without).
# Args: the built offgraph, a scratch folder.
set -u
. "$(dirname "$0")/python/build_env.sh"
og_python_build_env "$@"
rm -rf "$WORK" && mkdir -p "$WORK"
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
if ! $PY -c 'import jsonschema' 2>/dev/null; then
    echo "cli_python_tools: python3-jsonschema is missing: skipped"
    exit 77
fi
. "$SRC/tests/serve/server.sh"
major=$(sed -n 's/^#define OG_VERSION_MAJOR \([0-9]*\)/\1/p' "$SRC/include/offgraph.h")
LIB=$BUILD/liboffgraph.so.$major
[ -f "$LIB" ] || { echo "FAIL: no shared library at $LIB"; exit 1; }
[ -f "$BUILD/kjv-tiny.ogp" ] || { echo "FAIL: no demo model at $BUILD/kjv-tiny.ogp"; exit 1; }

. "$SRC/tests/python/sanitizer_env.sh"
og_python_sanitizer_env "$BUILD" cli_python_tools || exit 77
RUN=(env PYTHONPATH="$SRC/python" OFFGRAPH_LIB="$LIB" PYTHONDONTWRITEBYTECODE=1 "${SAN_ENV[@]}")

# the tools (tests/data/tools/weather_add.json, as cli_serve_tools)
cp "$SRC/tests/data/tools/weather_add.json" "$WORK/tools.json"

# export NAME TEMPLATE_FILE: the checkpoint with that chat template, a
# context past its 256 positions (the tools' system prompt is long)
export_with() {
    mkdir -p "$WORK/$1"
    cp "$SRC/tests/data/hf/qwen3-mixed/"* "$WORK/$1/"
    cp "$2" "$WORK/$1/chat_template.jinja"
    "$BIN" export "$WORK/$1" -o "$WORK/$1.ogp" --max-context 4096 --force-max-context >"$WORK/export.log" 2>&1 \
        || { fail "$1: export: $(cat "$WORK/export.log")"; return 1; }
}

for tpl in qwen3 llama-3.1 mistral-nemo; do
    export_with "$tpl" "$SRC/tests/data/chat_templates/$tpl.jinja" || continue
    start_server "$tpl" -m "$WORK/$tpl.ogp" || continue
    timeout 600 "${RUN[@]}" $PY "$SRC/tests/python/check_tools.py" calls "$WORK/$tpl.ogp" "$tpl" "$PORT" \
        "$WORK/tools.json" "$SRC/tests/data/chat_templates/tool_cases.json" "$SRC" || fail "$tpl: check_tools.py calls"
    kill -TERM $PID
    wait $PID || fail "$tpl: the server's exit status after SIGTERM"
    PID=
done

# a template that reads tools and writes calls its own way
cat >"$WORK/other.jinja" <<'JINJA'
{%- if tools %}{{ '<|im_start|>system\nFunctions: ' + (tools | tojson) + '<|im_end|>\n' }}{% endif %}
{%- for m in messages %}{{ '<|im_start|>' + m.role + '\n' + (m.content or '') + '<|im_end|>\n' }}{% endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
JINJA
if export_with other "$WORK/other.jinja" && [ -f "$WORK/qwen3.ogp" ]; then
    timeout 600 "${RUN[@]}" $PY "$SRC/tests/python/check_tools.py" refusals "$WORK/qwen3.ogp" "$BUILD/kjv-tiny.ogp" \
        "$WORK/other.ogp" "$WORK/tools.json" || fail "check_tools.py refusals"
fi
[ $fails -eq 0 ] && echo "cli_python_tools: ok" || echo "cli_python_tools: $fails failures"
exit $((fails > 0))
