#!/usr/bin/env bash
# offgraph chat's commands, answered locally and never sent to the model:
# /help, /system <text> (and --system), unknown /commands refused with a
# hint; "//" sends a leading slash; a line ending in \ goes on; then, on a
# pseudo-terminal (python3's pty module, every wait bounded), Ctrl-C stops
# a reply and returns to the prompt, and Ctrl-C twice at the prompt ends.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
HF=$SRC/tests/data/hf
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T() { timeout 120 "$@"; }

prog=$WORK/q.ogp
T "$BIN" export "$HF/qwen2-bias" -o "$prog" 2>/dev/null || fail "export"

# commands only: nothing reaches the model
printf '/help\n/frobnicate now\n/stats\n' | T "$BIN" chat -m "$prog" -n 4 >"$WORK/cmd.out" 2>"$WORK/cmd.err" ||
    fail "commands: exit status: $(cat "$WORK/cmd.err")"
grep -q "/system <text>" "$WORK/cmd.err" || fail "/help: $(cat "$WORK/cmd.err")"
grep -q "unknown command /frobnicate (not sent to the model)" "$WORK/cmd.err" || fail "unknown command: $(cat "$WORK/cmd.err")"
grep -q '"turn": 0, "prefill_tokens": 0, "generated_tokens": 0, "session_length": 0' "$WORK/cmd.out" ||
    fail "a command reached the model: $(cat "$WORK/cmd.out")"

# the same first message with and without a system prompt: the system prompt is prefilled with it
first_prefill() { python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1], errors="replace") if l.startswith("{\"turn\"")][0]["prefill_tokens"])' "$1"; }
printf 'Hello there\n/stats\n' | T "$BIN" chat -m "$prog" -n 4 --seed 1 >"$WORK/nosys.out" 2>/dev/null || fail "no system"
printf '/system You answer in one word.\nHello there\n/stats\n' | T "$BIN" chat -m "$prog" -n 4 --seed 1 \
    >"$WORK/sys.out" 2>"$WORK/sys.err" || fail "/system: exit status"
grep -q "system prompt set" "$WORK/sys.err" || fail "/system: $(cat "$WORK/sys.err")"
printf 'Hello there\n/stats\n' | T "$BIN" chat -m "$prog" -n 4 --seed 1 --system "You answer in one word." \
    >"$WORK/opt.out" 2>/dev/null || fail "--system: exit status"
a=$(first_prefill "$WORK/nosys.out") b=$(first_prefill "$WORK/sys.out") c=$(first_prefill "$WORK/opt.out")
[ -n "$a" ] && [ -n "$b" ] && [ "$b" -gt "$a" ] || fail "/system not prefilled ($a vs $b tokens)"
[ "$b" = "$c" ] || fail "/system and --system differ ($b vs $c tokens)"

# "//" sends one slash; a trailing backslash joins lines into one message
printf '//frobnicate\n/stats\n' | T "$BIN" chat -m "$prog" -n 2 >"$WORK/slash.out" 2>"$WORK/slash.err"
grep -q "unknown command" "$WORK/slash.err" && fail "// was taken for a command"
grep -q '"turn": 1' "$WORK/slash.out" || fail "// was not sent"
printf 'one line\\\nand another\n/stats\n' | T "$BIN" chat -m "$prog" -n 2 >"$WORK/ml.out" 2>/dev/null
grep -q '"turn": 1' "$WORK/ml.out" && ! grep -q '"turn": 2' "$WORK/ml.out" || fail "multi-line input: $(cat "$WORK/ml.out")"

# Ctrl-C on a terminal. A fixture exported with a large context and greedy
# decoding never ends its reply by itself within the test's seconds.
T "$BIN" export "$HF/llama-gqa" -o "$WORK/big.ogp" --max-context 1000000 --force-max-context 2>/dev/null ||
    fail "export big"
timeout 90 python3 - "$BIN" "$WORK/big.ogp" <<'PY' || fail "Ctrl-C on a terminal"
import os, pty, select, sys, time
binary, prog = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execv(binary, [binary, "chat", "-m", prog, "-n", "100000000", "--temp", "0"])
buf = b""
def wait_for(pat, timeout):
    global buf
    end = time.time() + timeout
    while pat not in buf and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                break
            if not d:
                break
            buf += d
    found = pat in buf
    if found:
        buf = buf[buf.index(pat) + len(pat):]
    return found
def check(ok, what):
    if not ok:
        print("FAIL:", what, buf[-400:])
        os.kill(pid, 9)
        sys.exit(1)
check(wait_for(b"> ", 30), "no first prompt")
os.write(fd, b"In the beginning\r")
check(wait_for(b"In the beginning", 10), "no echo")
time.sleep(1.0)
os.write(fd, b"\x03")
check(wait_for(b"reply stopped", 20), "Ctrl-C did not stop the reply")
check(wait_for(b"> ", 10), "no prompt after the stopped reply")
os.write(fd, b"/stats\r")
check(wait_for(b'"turn": 1', 10), "the conversation did not go on after Ctrl-C")
check(wait_for(b"> ", 10), "no prompt after /stats")
os.write(fd, b"\x03")
check(wait_for(b"Ctrl-C again", 10), "no hint after one Ctrl-C at the prompt")
os.write(fd, b"\x03")
end = time.time() + 20
while time.time() < end:
    p, status = os.waitpid(pid, os.WNOHANG)
    if p:
        check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "exit status %r" % status)
        sys.exit(0)
    r, _, _ = select.select([fd], [], [], 0.05)
    if r:
        try:
            os.read(fd, 65536)
        except OSError:
            pass
check(False, "a second Ctrl-C at the prompt did not end chat")
PY

[ $fails -eq 0 ] && echo "cli_chat_commands: all passed"
exit $((fails > 0))
