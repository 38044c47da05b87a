#!/usr/bin/env bash
# offgraph tokenize / detokenize on the demo model (the default) and on a
# tokenizer.json: ids round-trip to the text, from -p and from standard
# input, in each output form (plain, --ids, --show-pieces); special tokens
# in the text are parsed unless --no-parse-special; bad ids and options are
# refused with a message; --help works.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T="timeout 60"

text="In the beginning God created the heaven and the earth."
ids=$($T "$BIN" tokenize -p "$text") || fail "tokenize -p"
[ -n "$ids" ] && [ -z "$(printf %s "$ids" | tr -d '0-9 ')" ] || fail "tokenize printed '$ids', not ids"
back=$($T "$BIN" detokenize $ids) || fail "detokenize"
[ "$back" = "$text" ] || fail "round trip gave '$back'"

list=$(printf %s "$text" | $T "$BIN" tokenize --ids) || fail "tokenize from stdin"
[ "$list" = "[$(printf %s "$ids" | sed 's/ /, /g')]" ] || fail "--ids from stdin gave '$list' for '$ids'"
back=$(printf %s "$list" | $T "$BIN" detokenize) || fail "detokenize from stdin"
[ "$back" = "$text" ] || fail "--ids round trip gave '$back'"

pieces=$($T "$BIN" tokenize -p "$text" --show-pieces) || fail "--show-pieces"
[ "$(printf '%s\n' "$pieces" | wc -l)" = "$(printf %s "$ids" | wc -w)" ] || fail "--show-pieces: not one line a token"
printf '%s\n' "$pieces" | grep -q "^ *[0-9]* -> ' beginning'$" || fail "--show-pieces: no ' beginning' line: $pieces"

# special tokens written in the text
eos=$($T "$BIN" tokenize -p "<|endoftext|>") || fail "tokenize of a special token"
[ "$(printf %s "$eos" | wc -w)" = 1 ] || fail "<|endoftext|> gave '$eos', want one id"
plain=$($T "$BIN" tokenize -p "<|endoftext|>" --no-parse-special) || fail "--no-parse-special"
[ "$(printf %s "$plain" | wc -w)" -gt 1 ] || fail "--no-parse-special gave '$plain'"
[ "$($T "$BIN" detokenize $plain)" = "<|endoftext|>" ] || fail "--no-parse-special round trip"
$T "$BIN" tokenize -p "$text" --no-special >/dev/null || fail "--no-special"

# a tokenizer.json instead of a program
HF=$SRC/tests/data/hf/qwen2-bias
out=$($T "$BIN" tokenize --tokenizer "$HF/tokenizer.json" --tokenizer-config "$HF/tokenizer_config.json" -p "hello world") ||
    fail "--tokenizer"
[ "$($T "$BIN" detokenize --tokenizer "$HF/tokenizer.json" $out)" = "hello world" ] || fail "--tokenizer round trip"

# refusals
$T "$BIN" detokenize 999999999 >/dev/null 2>"$WORK/err" && fail "an id past the vocabulary was accepted"
grep -q "999999999" "$WORK/err" || fail "the refusal does not name the id: $(cat "$WORK/err")"
$T "$BIN" detokenize abc >/dev/null 2>&1 && fail "'abc' was accepted as an id"
$T "$BIN" tokenize --bogus </dev/null >/dev/null 2>&1; [ $? = 2 ] || fail "an unknown option is not a usage error"
$T "$BIN" tokenize --tokenizer /nonexistent.json -p x >/dev/null 2>"$WORK/err" && fail "a missing tokenizer.json"
grep -q /nonexistent.json "$WORK/err" || fail "the missing file is not named: $(cat "$WORK/err")"
$T "$BIN" tokenize --help | grep -q "usage: offgraph tokenize" || fail "tokenize --help"
$T "$BIN" detokenize --help | grep -q "usage: offgraph detokenize" || fail "detokenize --help"

if [ $fails -gt 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "ok"
