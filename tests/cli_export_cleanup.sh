#!/usr/bin/env bash
# An export killed while it writes leaves no temp file: SIGTERM (and SIGINT,
# SIGHUP) remove <out>.tmp before the signal ends it; a stale <out>.tmp left
# by a killed run (SIGKILL cannot be caught) is removed by the next export
# of the same target. OFFGRAPH_TEST_EXPORT_STALL=<percent> pauses the export
# there, with its temp file half written, so that the kill lands mid-export
# on any machine (the pause ends by itself after 30 s: no test waits longer).
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
HF=$SRC/tests/data/hf
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# waits (at most 20 s) for a file to appear
appear() { for _ in $(seq 200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }

for sig in TERM HUP; do
    out=$WORK/$sig.ogp
    OFFGRAPH_TEST_EXPORT_STALL=50 "$BIN" export "$HF/llama-gqa" -o "$out" 2>"$WORK/$sig.err" &
    pid=$!
    appear "$out.tmp" || fail "SIG$sig: the export never wrote its temp file"
    kill -$sig $pid
    wait $pid
    status=$?
    [ -e "$out.tmp" ] && fail "SIG$sig: $out.tmp left behind"
    [ -e "$out" ] && fail "SIG$sig: $out written"
    [ $status -ne 0 ] || fail "SIG$sig: exit status 0"
done

# SIGKILL leaves the temp file; the next export of the same target removes it
out=$WORK/kill.ogp
OFFGRAPH_TEST_EXPORT_STALL=50 "$BIN" export "$HF/llama-gqa" -o "$out" 2>/dev/null &
pid=$!
appear "$out.tmp" || fail "SIGKILL: the export never wrote its temp file"
kill -KILL $pid
wait $pid 2>/dev/null
[ -e "$out.tmp" ] || fail "SIGKILL: expected a stale temp file"
[ -e "$out" ] && fail "SIGKILL: $out written"
# a stale temp is not a program
"$BIN" inspect "$out" >/dev/null 2>&1 && fail "inspect found a program at $out"
timeout 60 "$BIN" export "$HF/llama-gqa" -o "$out" 2>/dev/null || fail "export after a killed one"
[ -e "$out.tmp" ] && fail "the stale temp file is still there"
"$BIN" inspect "$out" >/dev/null 2>&1 || fail "the export after a killed one is not a valid program"

# a failed export leaves nothing either (a refused --max-context, a missing folder)
timeout 60 "$BIN" export "$HF/llama-gqa" -o "$WORK/bad.ogp" --max-context 100000 2>/dev/null && fail "bad export succeeded"
timeout 60 "$BIN" export "$WORK/missing" -o "$WORK/bad.ogp" 2>/dev/null && fail "export of a missing folder succeeded"
ls "$WORK"/bad.ogp* >/dev/null 2>&1 && fail "a failed export left $(ls "$WORK"/bad.ogp*)"

[ $fails -eq 0 ] && echo "cli_export_cleanup: all passed"
exit $((fails > 0))
