#!/usr/bin/env bash
# The README's main job, as a user runs it: `offgraph run` with no -m uses the
# demo model, and its greedy text with f32 KV storage is, character for
# character, the prompt followed by the continuation transformers computed
# (models/kjv-tiny/golden.json, 48 tokens per prompt).
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
rm -rf "$WORK" && mkdir -p "$WORK"
python3 - "$SRC/models/kjv-tiny/golden.json" "$WORK" <<'PY'
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
for i, c in enumerate(cases):
    open(f"{sys.argv[2]}/{i}.prompt", "w").write(c["prompt"])
    open(f"{sys.argv[2]}/{i}.want", "w").write(c["prompt"] + c["continuation"] + "\n")
    open(f"{sys.argv[2]}/{i}.n", "w").write(str(len(c["continuation_ids"])))
PY
pass=0 fails=0
for p in "$WORK"/*.prompt; do
    i=$(basename "$p" .prompt)
    "$BIN" run -p "$(cat "$p")" -n "$(cat "$WORK/$i.n")" --temp 0 --kv-dtype f32 >"$WORK/$i.got" 2>"$WORK/$i.err"
    if cmp -s "$WORK/$i.got" "$WORK/$i.want"; then
        pass=$((pass + 1))
    else
        fails=$((fails + 1))
        echo "FAIL \"$(cat "$p")\": got: $(cat "$WORK/$i.got") $(cat "$WORK/$i.err")"
        echo "                 want: $(cat "$WORK/$i.want")"
    fi
done
echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ] && [ "$pass" -ge 3 ]
