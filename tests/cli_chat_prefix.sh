#!/usr/bin/env bash
# Prefix reuse across conversations in offgraph chat: after /reset, a
# conversation starts from a fork of the one it forgot (the longest common
# prefix: the system prompt, or the whole first turn when it is the same
# message) rather than reading it again. Checked: /stats reports reused
# tokens and the fewer prefilled ones, and the replies (greedy) equal those
# a fresh process gives to the same first turn (the oracle: nothing reused).
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
SYS="You are a preacher of the old book, and you answer in its words."
Q1="Tell me of the king of Israel."
Q2="Who was Moses?"
chat() { timeout 120 "$BIN" chat --system "$SYS" -n 24 --temp 0 2>"$WORK/err"; }

printf '%s\n/stats\n/reset\n%s\n/stats\n/reset\n%s\n/stats\n' "$Q1" "$Q1" "$Q2" | chat >"$WORK/one.txt" ||
    fail "chat exited $?: $(tail -3 "$WORK/err")"
printf '%s\n' "$Q1" | chat >"$WORK/fresh1.txt" || fail "fresh chat (1) exited $?"
printf '%s\n' "$Q2" | chat >"$WORK/fresh2.txt" || fail "fresh chat (2) exited $?"

python3 - "$WORK/one.txt" "$WORK/fresh1.txt" "$WORK/fresh2.txt" <<'PY' || fails=$((fails + 1))
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n") if l.strip()]
replies = [l for l in lines if not l.startswith("{")]
stats = [json.loads(l) for l in lines if l.startswith("{")]
fresh1 = open(sys.argv[2]).read().strip("\n")
fresh2 = open(sys.argv[3]).read().strip("\n")
bad = []
if len(replies) != 3 or len(stats) != 3:
    print("FAIL: want 3 replies and 3 /stats lines, got %d and %d" % (len(replies), len(stats)))
    sys.exit(1)
s1, s2, s3 = stats
print("first: %d prefilled, %d reused; same turn after /reset: %d prefilled, %d reused; "
      "another question after /reset: %d prefilled, %d reused"
      % (s1["prefill_tokens"], s1["reused_tokens"], s2["prefill_tokens"], s2["reused_tokens"],
         s3["prefill_tokens"], s3["reused_tokens"]))
if s1["reused_tokens"] != 0: bad.append("the first conversation reused %d tokens" % s1["reused_tokens"])
total = s1["prefill_tokens"]
if s2["reused_tokens"] + s2["prefill_tokens"] != total or s2["prefill_tokens"] != 2:
    bad.append("the same turn after /reset: %d reused + %d prefilled, want %d + 2"
               % (s2["reused_tokens"], s2["prefill_tokens"], total - 2))
if s3["reused_tokens"] < 10:
    bad.append("another question after /reset reused only %d tokens (the system prompt is more)" % s3["reused_tokens"])
if replies[0] != fresh1: bad.append("the first reply differs from a fresh process's: %r vs %r" % (replies[0], fresh1))
if replies[1] != fresh1: bad.append("the reply after /reset differs from a fresh process's: %r vs %r" % (replies[1], fresh1))
if replies[2] != fresh2: bad.append("the other question's reply differs from a fresh process's: %r vs %r" % (replies[2], fresh2))
for b in bad: print("FAIL: " + b)
sys.exit(1 if bad else 0)
PY

[ $fails -eq 0 ] && echo "cli_chat_prefix: ok" || echo "cli_chat_prefix: $fails failure(s)"
[ $fails -eq 0 ]
