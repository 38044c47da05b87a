#!/usr/bin/env bash
# offgraph perplexity against transformers: for every fixture of
# tests/data/hf, the mean negative log-likelihood of the scored tokens
# (positions ctx/2 .. ctx-2 predicting the next token) computed here in plain
# Python from the logits transformers wrote (logits.f32, the whole
# 64-token sequence: a chunk that starts at token 0 sees the same context in
# both) equals the command's, for one chunk of 64 and one of 32 tokens. The
# program is the f32 export with f32 KV, whose logits tests/cli_parity.sh
# holds within 2e-2 of transformers': each NLL is then within 2 x 2e-2, so
# the mean is too (measured ~1e-5). An off-by-one in the positions scored
# moves the mean by about one unit. Then the text path on the demo model
# (encoding a file) and the refusals (no input, both inputs, --ctx past the
# context, fewer tokens than one chunk).
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
for dir in "$SRC"/tests/data/hf/*/; do
    name=$(basename "$dir")
    prog=$WORK/$name.ogp
    if ! "$BIN" export "$dir" -o "$prog" --dtype f32 >"$WORK/$name.export.log" 2>&1; then
        fail "$name: export: $(cat "$WORK/$name.export.log")"
        continue
    fi
    for ctx in 64 32; do
        got=$("$BIN" perplexity -m "$prog" --tokens "@$dir/tokens.txt" --ctx $ctx --chunks 1 --kv-dtype f32 --json \
            --top1 "$WORK/$name.$ctx.top1" 2>"$WORK/$name.$ctx.err")
        python3 - "$dir" "$ctx" "$got" "$WORK/$name.$ctx.top1" <<'PY' || fail "$name ctx $ctx: $(cat "$WORK/$name.$ctx.err")"
import array, json, math, sys
d, ctx, got = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3] or "null")
top1 = [int(x) for x in open(sys.argv[4]).read().split()]
meta = json.load(open(d + "/meta.json"))
V = meta["vocab_size"]
logits = array.array("f")
logits.frombytes(open(d + "/logits.f32", "rb").read())
ids = [int(x) for x in open(d + "/tokens.txt").read().replace(",", " ").split()]
total, n, hits, near, top1_bad = 0.0, 0, 0, 0, 0
for j in range(ctx // 2, ctx - 1):
    row = logits[j * V:(j + 1) * V]
    mx = max(row)
    total += math.log(sum(math.exp(x - mx) for x in row)) + mx - row[ids[j + 1]]
    # the most likely token; where the top two are within twice the logit
    # bound (2 x 2e-2) either may come out first
    best = max(range(V), key=lambda v: row[v])
    second = max(row[v] for v in range(V) if v != best)
    tie = mx - second <= 0.04
    near += tie
    hits += best == ids[j + 1]
    if n >= len(top1) or (top1[n] != best and not tie):
        top1_bad += 1
    n += 1
want = total / n
ok = (got is not None and got["scored_tokens"] == n and abs(got["mean_nll"] - want) <= 0.04 and
      len(top1) == n and top1_bad == 0 and abs(got["top1_accuracy"] * n - hits) <= near)
if top1_bad or len(top1) != n:
    print(f"--top1: {len(top1)} ids for {n} positions, {top1_bad} differ from transformers' argmax")
print(f"{d.rstrip('/').split('/')[-1]} ctx {ctx}: mean NLL {got and got['mean_nll']} vs transformers {want:.8f} "
      f"({n} tokens): {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
    done
done
# the text path: the demo model scores a file it encodes itself
python3 - "$SRC/models/kjv-tiny/golden.json" >"$WORK/text.txt" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    print(c["prompt"] + c["continuation"])
PY
if out=$("$BIN" perplexity -f "$WORK/text.txt" --ctx 32 2>"$WORK/text.err"); then
    echo "demo model: $out"
    ppl=$(echo "$out" | sed -n 's/^perplexity \([0-9.]*\) .*/\1/p')
    # the model continues these prompts itself (golden.json is its own greedy text): far below its vocabulary
    python3 -c "import sys; v=float(sys.argv[1] or 'nan'); sys.exit(0 if 1 <= v < 50 else 1)" "$ppl" ||
        fail "demo model: perplexity \"$ppl\" of its own greedy text is not in [1, 50)"
else
    fail "demo model: $(cat "$WORK/text.err")"
fi
refuse() { # refuse WHAT NEEDLE ARGS...: exit status 1 or 2 and the message names it
    local what=$1 needle=$2
    shift 2
    if "$BIN" perplexity "$@" >"$WORK/r.out" 2>"$WORK/r.err"; then
        fail "$what: accepted"
    elif ! grep -q -- "$needle" "$WORK/r.err"; then
        fail "$what: the message does not say \"$needle\": $(cat "$WORK/r.err")"
    fi
}
refuse "no input" "give one of -f and --tokens"
refuse "both inputs" "give one of -f and --tokens" -f "$WORK/text.txt" --tokens 1,2,3
refuse "ctx past the context" "past the model's context" -f "$WORK/text.txt" --ctx 100000
refuse "too few tokens" "fewer than one chunk" --tokens 1,2,3,4,5 --ctx 8
refuse "a missing file" "$WORK/none.txt" -f "$WORK/none.txt"
echo "$fails failed"
[ "$fails" -eq 0 ]
