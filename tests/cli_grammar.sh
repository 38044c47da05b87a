#!/usr/bin/env bash
# --grammar and --json-schema on offgraph run and chat, on the demo model:
# run's output (greedy and sampled, the schema from a file or inline) is
# JSON that Debian's python3-jsonschema validates against the schema, and
# it ends because the grammar ended (finish stop, not at -n); a GBNF
# grammar's output matches the same language written as a Python regular
# expression; every reply of a chat validates, turn after turn, with the
# conversation kept in the session; a schema keyword the compiler does not
# support, a grammar that does not parse, a file that is missing and two
# grammars at once are refused by name before the model is read.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK"
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
$PY -c 'import jsonschema' 2>/dev/null || { echo "cli_grammar: python3-jsonschema is missing: skipped"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T() { timeout 300 "$@"; }

SCHEMA='{"type":"object","properties":{"name":{"type":"string","maxLength":20},"age":{"type":"integer"},"tribe":{"enum":["Judah","Levi"]},"sons":{"type":"array","items":{"type":"string","maxLength":10},"maxItems":2}},"required":["name","age","tribe","sons"],"additionalProperties":false}'
echo "$SCHEMA" >"$WORK/schema.json"
PROMPT="And the LORD said"

# validate FILE NAME: the generated text in FILE (after the prompt) must validate
validate() {
    $PY - "$1" "$WORK/schema.json" "$PROMPT" "$2" <<'PY'
import json, sys
import jsonschema
raw = open(sys.argv[1], encoding="utf-8").read()
schema = json.load(open(sys.argv[2]))
prompt, name = sys.argv[3], sys.argv[4]
assert raw.startswith(prompt) and raw.endswith("\n"), raw
text = raw[len(prompt):-1]
jsonschema.Draft202012Validator(schema).validate(json.loads(text))
print(f"{name}: {text}")
PY
}

for temp in 0 1; do
    T "$BIN" run -p "$PROMPT" -n 300 --temp $temp --seed 7 --json-schema "$WORK/schema.json" --stats \
        >"$WORK/run$temp.out" 2>"$WORK/run$temp.err" || fail "run --json-schema, temperature $temp: $(cat "$WORK/run$temp.err")"
    validate "$WORK/run$temp.out" "run, temperature $temp" || fail "run --json-schema, temperature $temp: not valid"
    grep -q '"finish_reason": "stop"' "$WORK/run$temp.err" ||
        fail "run --json-schema, temperature $temp: did not end with the grammar: $(cat "$WORK/run$temp.err")"
done
# the schema given inline is the same schema
T "$BIN" run -p "$PROMPT" -n 300 --temp 0 --json-schema "$SCHEMA" >"$WORK/inline.out" 2>"$WORK/inline.err" ||
    fail "run --json-schema inline: $(cat "$WORK/inline.err")"
cmp -s "$WORK/run0.out" "$WORK/inline.out" || fail "run --json-schema inline differs from the file's: $(cat "$WORK/inline.out")"
# llama.cpp's names: --json-schema-file / -jf / -j and --grammar-file take the same values
for opt in --json-schema-file -jf -j; do
    T "$BIN" run -p "$PROMPT" -n 300 --temp 0 $opt "$WORK/schema.json" >"$WORK/alias.out" 2>"$WORK/alias.err" ||
        fail "run $opt: $(cat "$WORK/alias.err")"
    cmp -s "$WORK/run0.out" "$WORK/alias.out" || fail "run $opt differs from --json-schema: $(cat "$WORK/alias.out")"
done
# free text is not JSON (the constraint did the work above)
T "$BIN" run -p "$PROMPT" -n 40 --temp 0 >"$WORK/free.out" 2>/dev/null
validate "$WORK/free.out" "free" >/dev/null 2>&1 && fail "free text validates: the test cannot tell"

# a GBNF grammar (a file, then the same text inline), checked by a regular expression
cat >"$WORK/begat.gbnf" <<'G'
# a line of the begats
root ::= "The " name " begat " name (", and " name)? "."
name ::= [A-Z] [a-z]{2,8}
G
T "$BIN" run -p "$PROMPT" -n 60 --temp 1 --seed 3 --grammar "$WORK/begat.gbnf" >"$WORK/gbnf.out" 2>"$WORK/gbnf.err" ||
    fail "run --grammar: $(cat "$WORK/gbnf.err")"
T "$BIN" run -p "$PROMPT" -n 60 --temp 1 --seed 3 --grammar "$(cat "$WORK/begat.gbnf")" >"$WORK/gbnf2.out" 2>&1 ||
    fail "run --grammar inline: $(cat "$WORK/gbnf2.out")"
cmp -s "$WORK/gbnf.out" "$WORK/gbnf2.out" || fail "run --grammar inline differs from the file's"
T "$BIN" run -p "$PROMPT" -n 60 --temp 1 --seed 3 --grammar-file "$WORK/begat.gbnf" >"$WORK/gbnf3.out" 2>&1 ||
    fail "run --grammar-file: $(cat "$WORK/gbnf3.out")"
cmp -s "$WORK/gbnf.out" "$WORK/gbnf3.out" || fail "run --grammar-file differs from --grammar"
$PY - "$WORK/gbnf.out" "$PROMPT" <<'PY' || fail "run --grammar: the output is not in the grammar's language"
import re, sys
raw = open(sys.argv[1], encoding="utf-8").read()
text = raw[len(sys.argv[2]):-1]
assert raw.startswith(sys.argv[2]) and re.fullmatch(r"The [A-Z][a-z]{2,8} begat [A-Z][a-z]{2,8}(, and [A-Z][a-z]{2,8})?\.", text), text
print("gbnf:", text)
PY

# chat: every reply follows the schema, and the conversation goes on in its session
printf 'Who begat whom?\n/stats\nAnd then?\n/stats\n' |
    T "$BIN" chat -n 300 --temp 0 --json-schema "$WORK/schema.json" >"$WORK/chat.out" 2>"$WORK/chat.err" ||
    fail "chat --json-schema: $(cat "$WORK/chat.err")"
$PY - "$WORK/chat.out" "$WORK/schema.json" <<'PY' || fail "chat --json-schema: $(cat "$WORK/chat.out")"
import json, re, sys
import jsonschema
schema = json.load(open(sys.argv[2]))
# each reply (JSON may hold newlines) is followed by a newline and its /stats line
parts = re.split(r'^(\{"turn": .*)\n', open(sys.argv[1], encoding="utf-8").read(), flags=re.M)
replies, stats = [p[:-1] for p in parts[0::2] if p], [json.loads(p) for p in parts[1::2]]
assert len(replies) == 2 and len(stats) == 2, parts
for r in replies:
    jsonschema.Draft202012Validator(schema).validate(json.loads(r))
    print("chat:", r)
# the second turn went on in the session (the model has no chat template:
# the first reply's text reads back as other tokens, so the session keeps
# the prompt before it)
assert [s["turn"] for s in stats] == [1, 2] and stats[1]["reused_tokens"] > 0, stats
PY

# refusals, before the model is read
T "$BIN" run -p x --json-schema '{"type":"string","pattern":"^a"}' >/dev/null 2>"$WORK/e1" && fail "pattern accepted"
grep -q "pattern" "$WORK/e1" || fail "an unsupported keyword is not named: $(cat "$WORK/e1")"
printf 'root ::= "a" (\n' >"$WORK/bad.gbnf"
T "$BIN" chat --grammar "$WORK/bad.gbnf" </dev/null >/dev/null 2>"$WORK/e2" && fail "a broken grammar accepted"
grep -q "grammar: line 2, column 1" "$WORK/e2" || fail "a broken grammar: no line: $(cat "$WORK/e2")"
T "$BIN" run -p x --grammar "$WORK/missing.gbnf" >/dev/null 2>"$WORK/e3" && fail "a missing grammar file accepted"
grep -q "no such file" "$WORK/e3" || fail "a missing file: $(cat "$WORK/e3")"
T "$BIN" run -p x --grammar "$WORK/begat.gbnf" --json-schema "$WORK/schema.json" >/dev/null 2>"$WORK/e4"
[ $? = 2 ] || fail "two grammars: not a usage error: $(cat "$WORK/e4")"

[ $fails -eq 0 ] && echo "cli_grammar: all passed"
exit $((fails > 0))
