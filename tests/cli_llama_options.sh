#!/usr/bin/env bash
# llama.cpp's habits on the command line (tools/main.c, tools/cli.c): each of
# -s, -r, -n -1, -c, -t, -ngl, -fa, -b and -sys does what offgraph's own
# option does (the same text as it, on the demo model), a prompt may be the
# words after the options, a mistyped option or command is refused naming
# the nearest one, an option of another command is refused naming it, and
# the --help of run, chat, serve and bench lists them.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T() { timeout 120 "$@"; }
P="In the beginning"

# same A B...: the run with llama.cpp's options (before --) gives the text
# and exit status of the run with offgraph's (after --)
same() {
    local what=$1
    shift
    local a=() b=() seen=0
    for x in "$@"; do
        if [ "$x" = "--" ]; then seen=1; continue; fi
        if [ $seen = 0 ]; then a+=("$x"); else b+=("$x"); fi
    done
    local ra rb
    T "$BIN" run "${a[@]}" >"$WORK/a.out" 2>"$WORK/a.err"; ra=$?
    T "$BIN" run "${b[@]}" >"$WORK/b.out" 2>"$WORK/b.err"; rb=$?
    [ $ra = 0 ] || fail "$what: run ${a[*]}: $(cat "$WORK/a.err")"
    [ $ra = $rb ] && cmp -s "$WORK/a.out" "$WORK/b.out" ||
        fail "$what: '$(cat "$WORK/a.out")' ($ra) differs from offgraph's '$(cat "$WORK/b.out")' ($rb)"
}

# ---- each option, against offgraph's own
same "-s" -p "$P" -n 16 --temp 1.5 -s 7 -- -p "$P" -n 16 --temp 1.5 --seed 7
T "$BIN" run -p "$P" -n 16 --temp 1.5 -s 8 >"$WORK/s8.out" 2>/dev/null
cmp -s "$WORK/a.out" "$WORK/s8.out" && fail "-s 7 and -s 8 gave the same text: the seed was not used"
T "$BIN" run -p "$P" -n 24 --temp 0 >"$WORK/free.out" 2>/dev/null
stop=$(python3 -c "import sys; t=open(sys.argv[1]).read()[len(sys.argv[2]):].split(); print(' '.join(t[2:4]))" \
    "$WORK/free.out" "$P")
same "-r" -p "$P" -n 24 --temp 0 -r "$stop" -- -p "$P" -n 24 --temp 0 --stop "$stop"
same "--reverse-prompt" -p "$P" -n 24 --temp 0 --reverse-prompt "$stop" -- -p "$P" -n 24 --temp 0 --stop "$stop"
grep -qF -- "$stop" "$WORK/a.out" && fail "-r: the text goes on past '$stop'"
same "-n -1" -p "$P" -n -1 -c 40 --temp 0 -- -p "$P" -n 0 -c 40 --temp 0
same "-n -2" -p "$P" -n -2 -c 40 --temp 0 -- -p "$P" -n 0 -c 40 --temp 0
same "--n-predict" -p "$P" --n-predict 5 --temp 0 -- -p "$P" -n 5 --temp 0
same "-t" -p "$P" -n 8 --temp 0 -t 1 -- -p "$P" -n 8 --temp 0 --threads 1
same "-t -1" -p "$P" -n 8 --temp 0 -t -1 -- -p "$P" -n 8 --temp 0
same "-ngl 0" -p "$P" -n 8 --temp 0 -ngl 0 -- -p "$P" -n 8 --temp 0 --backend cpu
same "-fa on" -p "$P" -n 8 --temp 0 -fa on -- -p "$P" -n 8 --temp 0
same "-b" -p "$P" -n 8 --temp 0 -b 4 -- -p "$P" -n 8 --temp 0
same "--temperature" -p "$P" -n 8 --temperature 0 -- -p "$P" -n 8 --temp 0
# -ngl 99: CUDA (this build may have none: then the message names it)
if ! T "$BIN" run -p "$P" -n 4 --temp 0 -ngl 99 >/dev/null 2>"$WORK/ngl.err"; then
    grep -qi "cuda" "$WORK/ngl.err" || fail "-ngl 99: $(cat "$WORK/ngl.err")"
fi
T "$BIN" run -p "$P" -n 4 -fa off >/dev/null 2>"$WORK/fa.err" || fail "-fa off: $(cat "$WORK/fa.err")"
grep -q "no effect" "$WORK/fa.err" || fail "-fa off: no note that it has no effect"
T "$BIN" run -p "$P" -n 4 -fa maybe >/dev/null 2>&1; [ $? = 2 ] || fail "-fa maybe: not a usage error"
T "$BIN" run -p "$P" -n 4 -t 0 >/dev/null 2>&1; [ $? = 2 ] || fail "-t 0: not a usage error"
# -c: the context (context_limit in --stats)
T "$BIN" run -p "$P" -n 2 -c 48 --stats >/dev/null 2>"$WORK/c.err" || fail "-c 48: $(cat "$WORK/c.err")"
grep -q '"context_limit": 48' "$WORK/c.err" || fail "-c 48: $(cat "$WORK/c.err")"
T "$BIN" run -p "$P" -n 2 --ctx-size 48 --stats >/dev/null 2>"$WORK/c.err" || fail "--ctx-size 48"
grep -q '"context_limit": 48' "$WORK/c.err" || fail "--ctx-size 48: $(cat "$WORK/c.err")"
# bench: -b is --rows (the prefill's steps), -s --seed
DEMO=$(dirname "$BIN")/kjv-tiny.ogp
T "$BIN" bench -m "$DEMO" --prompt 32 --gen 2 -b 8 -s 3 -t 1 --json >"$WORK/b1.json" 2>"$WORK/b1.err" ||
    fail "bench -b -s -t: $(cat "$WORK/b1.err")"
T "$BIN" bench -m "$DEMO" --prompt 32 --gen 2 --rows 8 --seed 3 --threads 1 --json >"$WORK/b2.json" 2>/dev/null ||
    fail "bench --rows --seed"
python3 - "$WORK/b1.json" "$WORK/b2.json" <<'PY' || fail "bench -b 8: $(cat "$WORK/b1.json") vs $(cat "$WORK/b2.json")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["steps"] == b["steps"] and a["kv_bytes_live"] == b["kv_bytes_live"], (a, b)
assert a["steps"] >= 4 + 1 + 2, a  # 32 prompt tokens in steps of at most 8 rows
PY

# serve: -s is --seed, the base of the seeds of requests that give none
# (the first request of a server started with -s 5 draws what one of a
# server started with --seed 5 draws); -np is --max-sessions
before_serve=$fails
. "$SRC/tests/serve/server.sh" # (sets fails to 0)
fails=$before_serve
for how in "-s 5" "--seed 5" "-s 6"; do
    start_server "serve$how" $how -np 2 -t 1
    [ -n "$PID" ] || continue
    python3 - "$PORT" >"$WORK/serve$how.txt" <<'PY' || fail "serve $how: a completion"
import json, sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions",
                             json.dumps({"prompt": "In the beginning", "max_tokens": 16, "temperature": 1.5}).encode(),
                             {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"])
PY
    kill -TERM $PID
    wait $PID || fail "serve $how: exit status after SIGTERM"
    PID=
done
cmp -s "$WORK/serve-s 5.txt" "$WORK/serve--seed 5.txt" || fail "serve -s 5 and --seed 5 drew different texts"
cmp -s "$WORK/serve-s 5.txt" "$WORK/serve-s 6.txt" && fail "serve -s 5 and -s 6 drew the same text"

# ---- a positional prompt: the words after the options, joined
same "positional" -n 8 --temp 0 "$P" -- -p "$P" -n 8 --temp 0
same "positional words" In the beginning -n 8 --temp 0 -- -p "$P" -n 8 --temp 0
T "$BIN" run -p "$P" "more words" >/dev/null 2>"$WORK/twice.err"; [ $? = 2 ] || fail "a prompt given twice: not a usage error"
grep -q "given twice" "$WORK/twice.err" || fail "a prompt given twice: $(cat "$WORK/twice.err")"
# a value that looks like an option is a value (-p's, --stop's)
T "$BIN" run -p "-x" -n 2 --temp 0 >"$WORK/dash.out" 2>"$WORK/dash.err" || fail "-p -x: $(cat "$WORK/dash.err")"

# ---- chat: -sys is --system
printf 'Who made the earth?\n' | T "$BIN" chat -sys "Answer briefly." -n 12 --temp 0 >"$WORK/sys1.out" 2>/dev/null ||
    fail "chat -sys"
printf 'Who made the earth?\n' | T "$BIN" chat --system "Answer briefly." -n 12 --temp 0 >"$WORK/sys2.out" 2>/dev/null
[ -s "$WORK/sys1.out" ] && cmp -s "$WORK/sys1.out" "$WORK/sys2.out" || fail "chat -sys differs from --system"
printf 'Who made the earth?\n' | T "$BIN" chat -n 12 --temp 0 >"$WORK/sys0.out" 2>/dev/null
cmp -s "$WORK/sys1.out" "$WORK/sys0.out" && fail "chat -sys: the same reply as without a system prompt"

# ---- mistakes: the nearest option, the command that has it
expect() { # status needle args...
    local status=$1 needle=$2
    shift 2
    T "$BIN" "$@" >/dev/null 2>"$WORK/e.err"
    local got=$?
    [ $got = "$status" ] || fail "$*: exit status $got, want $status"
    grep -qF -- "$needle" "$WORK/e.err" || fail "$*: '$(cat "$WORK/e.err")' does not say '$needle'"
}
expect 2 'unknown option "--temprature"; did you mean --temperature (--temp)?' run --temprature 0 -p x
expect 2 'did you mean --max-tokens?' run --max-token 3 -p x
expect 2 'did you mean --stop?' run --stpo x -p x
expect 2 'did you mean --ctx-size?' run --ctx-sise 64 -p x
expect 2 'did you mean --system?' chat --sytem hi
expect 2 'did you mean --max-sessions?' serve --max-sesions 4
expect 2 'did you mean --prompt?' bench --promt 8
expect 2 'did you mean --max-context?' export x -o y --max-contex 8
expect 2 '-sys is llama.cpp'"'"'s name of --system, which offgraph run does not take' run -sys hi -p x
expect 2 'unknown command "rnu"; did you mean run?' rnu -p x
expect 2 'unknown option "--frobnicate"' run --frobnicate
grep -q "did you mean" "$WORK/e.err" && fail "--frobnicate: a suggestion far from anything: $(cat "$WORK/e.err")"

# ---- --help of every command that runs a model lists them
for cmd in run chat serve bench; do
    T "$BIN" $cmd --help >"$WORK/$cmd.help" 2>&1 || fail "$cmd --help: exit status"
    for opt in "-c, --ctx-size" "-t, --threads" "-ngl, --n-gpu-layers" "-fa, --flash-attn" "-b, --batch-size" \
               "-m, --model <path>" "Hugging Face"; do
        grep -qF -- "$opt" "$WORK/$cmd.help" || fail "$cmd --help does not list $opt"
    done
done
grep -q '^  -s  *--seed' "$WORK/run.help" || fail "run --help: no -s"
grep -q '^  -r, --reverse-prompt  *--stop' "$WORK/run.help" || fail "run --help: no -r"
grep -q 'the prompt: offgraph run \[options\] <prompt>' "$WORK/run.help" || fail "run --help: no positional prompt"
grep -q '^  -sys, --system-prompt  *--system' "$WORK/chat.help" || fail "chat --help: no -sys"
grep -q '^  -np, --parallel  *--max-sessions' "$WORK/serve.help" || fail "serve --help: no -np"
grep -q '^  -s  *--seed' "$WORK/bench.help" || fail "bench --help: no -s"

[ $fails -eq 0 ] && echo "cli_llama_options: all passed"
exit $((fails > 0))
