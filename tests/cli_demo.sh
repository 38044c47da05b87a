#!/usr/bin/env bash
# offgraph demo: --help, the per-session table, and usage errors.
# Args: path of the built offgraph, a scratch directory.
set -euo pipefail
og=$1
work=$2
mkdir -p "$work"
fail() { echo "cli_demo: $*" >&2; exit 1; }

"$og" demo --help >"$work/help.txt" || fail "--help exited non-zero"
grep -q "usage: offgraph demo" "$work/help.txt" || fail "--help printed no usage"

"$og" demo >"$work/out.txt" || fail "demo exited non-zero"
# Session lengths are prompt + 20 decode steps: 100, 300, 900 tokens of prompt.
for len in 120 320 920; do
    grep -Eq "^[0-9]+ +[0-9]+ +20 +$len " "$work/out.txt" || fail "no session of length $len"
done
[ "$(grep -Ec '^[0-9]+ ' "$work/out.txt")" -eq 3 ] || fail "expected 3 session rows"
# Session 0: flat rows 100 -> 200, ring R = 128 + 256 - 1 = 383; rows of 4*64 bf16 = 512 bytes;
# k and v: 2 * 512 * (2*200 + 2*383) = 1193984 bytes allocated, 2*512*4*120 = 491520 live.
grep -Eq "^0 +100 +20 +120 +21 +1193984 +491520 +2 +1 " "$work/out.txt" || fail "session 0 metrics differ"

"$og" demo --sessions 5 >/dev/null || fail "--sessions 5 failed"
set +e
"$og" demo --sessions 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--sessions 0 should be a usage error"
"$og" demo --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown option should be a usage error"
echo "cli_demo: ok"
