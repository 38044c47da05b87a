#!/usr/bin/env bash
# -m on a Hugging Face checkpoint folder or a GGUF file (tools/cli.c,
# og_cli_resolve_model): the first start exports it into the cache
# ($XDG_CACHE_HOME/offgraph, else ~/.cache/offgraph) and runs it, giving the
# text a program exported by `offgraph export` gives; the second start reads
# the same file (no export: the file's inode and time unchanged); a changed
# source or another --weights is another export; an export killed half-way
# leaves no program in the cache (temp file and rename), a second start
# waits for an export under way (one lock on the cache folder) and does it
# itself when that one is killed. -c bounds a session's context at run and
# serve time (og_model_set_context), up to the program's max-context.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
HF=$SRC/tests/data/hf
GG=$SRC/tests/data/gguf
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T() { timeout 120 "$@"; }
export XDG_CACHE_HOME=$WORK/cache
CACHE=$XDG_CACHE_HOME/offgraph
PROMPT="The cache lives"
# waits (at most 20 s) for a file matching a glob to appear
appear() { for _ in $(seq 200); do compgen -G "$1" >/dev/null && return 0; sleep 0.1; done; return 1; }
# the cache's programs of a source name, oldest first
progs() { ls -tr "$CACHE" 2>/dev/null | grep -E "^$1-[0-9a-f]{16}\.ogp\$" | sed "s|^|$CACHE/|"; }

# ---- a checkpoint folder and a GGUF file, twice each
for src in "$HF/llama-gqa" "$GG/llama-gqa-f32.gguf"; do
    name=$(basename "$src" .gguf)
    T "$BIN" export "$src" -o "$WORK/$name.ogp" 2>/dev/null || fail "$name: offgraph export"
    want=$(T "$BIN" run -m "$WORK/$name.ogp" -p "$PROMPT" -n 12 --temp 0 2>/dev/null)
    got=$(T "$BIN" run -m "$src" -p "$PROMPT" -n 12 --temp 0 2>"$WORK/$name.1.err") ||
        fail "$name: run -m on the source: $(cat "$WORK/$name.1.err")"
    [ -n "$want" ] && [ "$got" = "$want" ] || fail "$name: run -m on the source gave '$got', its export '$want'"
    grep -q "exporting .* into the cache, once: $CACHE/$name-[0-9a-f]*\.ogp" "$WORK/$name.1.err" ||
        fail "$name: the first start did not say it exported: $(cat "$WORK/$name.1.err")"
    files=$(progs "$name" | wc -l)
    [ "$files" = 1 ] || fail "$name: $files programs in the cache, want 1"
    prog=$(progs "$name" | head -1)
    T "$BIN" inspect "$prog" >/dev/null 2>&1 || fail "$name: the cached program is not valid"
    before=$(stat -c '%i %Y %s' "$prog")
    got2=$(T "$BIN" run -m "$src" -p "$PROMPT" -n 12 --temp 0 2>"$WORK/$name.2.err") ||
        fail "$name: the second start: $(cat "$WORK/$name.2.err")"
    [ "$got2" = "$want" ] || fail "$name: the second start gave '$got2'"
    grep -q "exporting" "$WORK/$name.2.err" && fail "$name: the second start exported again"
    [ "$(stat -c '%i %Y %s' "$prog")" = "$before" ] || fail "$name: the cached program was rewritten"
    ls "$CACHE" | grep -q '\.tmp$' && fail "$name: a temp file is left in the cache"
done

# ---- the key: another --weights, a changed source are other exports
T "$BIN" run -m "$HF/llama-gqa" --weights q8 -p "$PROMPT" -n 4 --temp 0 >/dev/null 2>"$WORK/q8.err" ||
    fail "--weights q8: $(cat "$WORK/q8.err")"
grep -q "exporting" "$WORK/q8.err" || fail "--weights q8 read the default export"
[ "$(progs llama-gqa | wc -l)" = 2 ] || fail "--weights q8: not a second program"
[ "$(stat -c %s "$(progs llama-gqa | tail -1)")" -lt "$(stat -c %s "$(progs llama-gqa | head -1)")" ] ||
    fail "--weights q8: the program is not smaller than the bf16 one"
cp -r "$HF/llama-gqa" "$WORK/copy"
T "$BIN" run -m "$WORK/copy" -p "$PROMPT" -n 2 --temp 0 >/dev/null 2>&1 || fail "run -m a copied folder"
touch -d '2001-01-01' "$WORK/copy/config.json"
T "$BIN" run -m "$WORK/copy" -p "$PROMPT" -n 2 --temp 0 >/dev/null 2>"$WORK/changed.err" || fail "run -m a changed folder"
grep -q "exporting" "$WORK/changed.err" || fail "a changed source read the old export"
# ~/.cache/offgraph without XDG_CACHE_HOME
(unset XDG_CACHE_HOME; HOME=$WORK/home T "$BIN" run -m "$HF/llama-gqa" -p "$PROMPT" -n 2 --temp 0 >/dev/null 2>&1) ||
    fail "run -m without XDG_CACHE_HOME"
ls "$WORK"/home/.cache/offgraph/llama-gqa-*.ogp >/dev/null 2>&1 || fail "no program under HOME/.cache/offgraph"

# ---- -m that is none of these: named, with what -m takes
T "$BIN" run -m "$SRC/README.md" -p x >/dev/null 2>"$WORK/bad.err" && fail "run -m README.md succeeded"
grep -q "a Hugging Face checkpoint folder or a GGUF file" "$WORK/bad.err" || fail "-m README.md: $(cat "$WORK/bad.err")"
T "$BIN" run -m "$HF" -p x >/dev/null 2>"$WORK/dir.err" && fail "run -m on a folder without config.json succeeded"
grep -q "without a config.json" "$WORK/dir.err" || fail "-m on a folder without config.json: $(cat "$WORK/dir.err")"

# ---- an export killed half-way leaves no program; a start waiting for it exports itself
export XDG_CACHE_HOME=$WORK/cache2
CACHE=$XDG_CACHE_HOME/offgraph
OFFGRAPH_TEST_EXPORT_STALL=50 "$BIN" run -m "$HF/qwen2-bias" -p "$PROMPT" -n 2 >/dev/null 2>"$WORK/a.err" &
a=$!
appear "$CACHE/qwen2-bias-*.ogp.tmp" || fail "the first start never wrote its temp file"
ls "$CACHE"/*.ogp >/dev/null 2>&1 && fail "a program is in the cache while its export is under way"
timeout 120 "$BIN" run -m "$HF/qwen2-bias" -p "$PROMPT" -n 2 --temp 0 >"$WORK/b.out" 2>"$WORK/b.err" &
b=$!
for _ in $(seq 100); do grep -q "waiting for another offgraph" "$WORK/b.err" && break; sleep 0.1; done
grep -q "waiting for another offgraph" "$WORK/b.err" || fail "the second start did not wait: $(cat "$WORK/b.err")"
kill -KILL $a
wait $a 2>/dev/null
wait $b || fail "the start that waited failed: $(cat "$WORK/b.err")"
grep -q "exporting" "$WORK/b.err" || fail "the start that waited did not export"
[ "$(progs qwen2-bias | wc -l)" = 1 ] || fail "not one program after the killed export"
ls "$CACHE" | grep -q '\.tmp$' && fail "the killed export's temp file is still there"
T "$BIN" inspect "$(progs qwen2-bias)" >/dev/null 2>&1 || fail "the program after a killed export is not valid"
export XDG_CACHE_HOME=$WORK/cache

# ---- -c: a session's context, up to the program's max-context
# the demo model: a prompt longer than -c is refused before any step; -n 0
# stops at -c tokens; more than the program declares is refused naming it
long=$(printf 'In the beginning God created the heaven and the earth. %.0s' 1 2 3 4 5 6)
T "$BIN" run -c 24 -p "$long" -n 4 >/dev/null 2>"$WORK/c.err" && fail "-c 24 took a longer prompt"
grep -q "context limit of 24 tokens" "$WORK/c.err" || fail "-c 24, a longer prompt: $(cat "$WORK/c.err")"
T "$BIN" run -c 40 -p "In the beginning" -n 0 --temp 0 --stats >"$WORK/c40.out" 2>"$WORK/c40.err" ||
    fail "-c 40 -n 0: $(cat "$WORK/c40.err")"
python3 - "$WORK/c40.err" <<'PY' || fail "-c 40 -n 0: $(cat "$WORK/c40.err")"
import json, sys
s = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert s["context_limit"] == 40, s
assert s["finish_reason"] == "length" and s["prompt_tokens"] + s["generated_tokens"] == 41, s
PY
T "$BIN" run -c 100000000 -p x -n 1 >/dev/null 2>"$WORK/cbig.err" && fail "-c 100000000 accepted"
grep -q -- "-c 100000000 is more than the .* tokens" "$WORK/cbig.err" || fail "-c too large: $(cat "$WORK/cbig.err")"
# serve: -c bounds every request; the model is named after the folder
before_serve=$fails
. "$SRC/tests/serve/server.sh" # (sets fails to 0)
fails=$before_serve
start_server serve -m "$HF/llama-gqa" -c 24
if [ -n "$PID" ]; then
    python3 - "$PORT" "$long" <<'PY' || fail "serve -c 24"
import json, sys, urllib.request, urllib.error
port, long = sys.argv[1], sys.argv[2]
def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60))
assert [m["id"] for m in models["data"]] == ["llama-gqa"], models
st, r = post({"model": "llama-gqa", "prompt": long, "max_tokens": 4})
assert st == 400 and "24" in r["error"]["message"], (st, r)
st, r = post({"model": "llama-gqa", "prompt": "The cache", "max_tokens": 100, "temperature": 0})
assert st == 200, (st, r)
u = r["usage"]
assert u["prompt_tokens"] + u["completion_tokens"] <= 25 and r["choices"][0]["finish_reason"] == "length", r
PY
    kill -TERM $PID
    wait $PID || fail "serve: exit status after SIGTERM"
fi

[ $fails -eq 0 ] && echo "cli_model_cache: all passed"
exit $((fails > 0))
