#!/usr/bin/env bash
# k-quant GGUF files from the command line (tests/data/kquant, written by
# llama-quantize: see tests/fixtures/make_kquant_fixtures.py): each exports
# naming its types; the no_vocab program runs under eval, bench and
# perplexity --tokens, and run refuses it naming no_vocab; --weights takes
# the k-quant names and mixes and refuses others by name.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
KQ=$SRC/tests/data/kquant
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

declare -A TYPES=([Q4_K_M]="q4_k, q6_k" [Q5_K_M]="q5_k, q6_k" [Q6_K]="q6_k" [Q2_K]="q2_k, q3_k, q6_k")
for ft in Q4_K_M Q5_K_M Q6_K Q2_K; do
  "$BIN" export "$KQ/qwen3-kq-$ft.gguf" -o "$WORK/$ft.ogp" 2>"$WORK/$ft.err" || fail "$ft: export: $(cat "$WORK/$ft.err")"
  grep -q "MB of ${TYPES[$ft]} .*tokenizer absent" "$WORK/$ft.err" || fail "$ft: summary: $(cat "$WORK/$ft.err")"
done

TOK=$(seq -s, 1 7 250)
"$BIN" eval -m "$WORK/Q4_K_M.ogp" --backend cpu --tokens "$TOK" --chunk 5 --logits-out "$WORK/l.f32" 2>"$WORK/eval.err" ||
  fail "eval: $(cat "$WORK/eval.err")"
[[ $(stat -c %s "$WORK/l.f32" 2>/dev/null) == $((36 * 256 * 4)) ]] || fail "eval: logits of $(stat -c %s "$WORK/l.f32" 2>/dev/null) bytes"
"$BIN" perplexity -m "$WORK/Q4_K_M.ogp" --backend cpu --ctx 16 --tokens "$TOK" >"$WORK/ppl.out" 2>&1 ||
  fail "perplexity: $(cat "$WORK/ppl.out")"
grep -q "^perplexity [0-9.]* " "$WORK/ppl.out" || fail "perplexity: $(cat "$WORK/ppl.out")"
"$BIN" bench -m "$WORK/Q4_K_M.ogp" --backend cpu --prompt 8 --gen 8 --json >"$WORK/bench.out" 2>&1 ||
  fail "bench: $(cat "$WORK/bench.out")"
grep -q '"decode_tokens_per_s"' "$WORK/bench.out" || fail "bench: $(cat "$WORK/bench.out")"
if "$BIN" run -m "$WORK/Q4_K_M.ogp" --backend cpu -p hi >"$WORK/run.out" 2>&1; then fail "run of a no_vocab program succeeded"; fi
grep -q 'no tokenizer (exported from a GGUF file whose tokenizer.ggml.model is "no_vocab")' "$WORK/run.out" ||
  fail "run: $(cat "$WORK/run.out")"

# --weights: a k-quant name, a mix (any case), refusals by name
"$BIN" export "$KQ/qwen3-kq-Q6_K.gguf" -o "$WORK/f32.ogp" --weights f32 2>"$WORK/f32.err" || fail "--weights f32: $(cat "$WORK/f32.err")"
grep -q "MB of f32 weights" "$WORK/f32.err" || fail "--weights f32: $(cat "$WORK/f32.err")"
"$BIN" export "$WORK/../cli_kquant.missing" -o "$WORK/x.ogp" --weights Q4_K_M 2>"$WORK/mix.err"
grep -q "unknown option\|--weights must" "$WORK/mix.err" && fail "--weights Q4_K_M refused: $(cat "$WORK/mix.err")"
"$BIN" export "$KQ/qwen3-kq-Q6_K.gguf" -o "$WORK/q4k.ogp" --weights q4_k_m 2>"$WORK/q4k.err" || fail "--weights q4_k_m: $(cat "$WORK/q4k.err")"
grep -q "MB of q4_k_m mix" "$WORK/q4k.err" || fail "--weights q4_k_m: $(cat "$WORK/q4k.err")"
for bad in iq4_xs q4_1 q5_k_x; do
  if "$BIN" export "$KQ/qwen3-kq-Q6_K.gguf" -o "$WORK/bad.ogp" --weights $bad 2>"$WORK/bad.err"; then fail "--weights $bad accepted"; fi
  grep -q "got \"$bad\"" "$WORK/bad.err" || fail "--weights $bad: $(cat "$WORK/bad.err")"
  [[ -e $WORK/bad.ogp ]] && fail "--weights $bad left a file"
done

if ((fails)); then exit 1; fi
echo "cli_kquant: all checks passed"
