#!/usr/bin/env bash
# OG_CUDA_PROFILE (src/exec/profile_cuda.h) on the demo model, checked
# against what the program holds: the table of one-session decode steps has
# one update_and_attend a step per layer (`offgraph inspect` says how many),
# the head's product (hidden -> vocabulary) once a step with a GB/s, and
# shares that sum to 100 %; a second model's table is appended, not written
# over.
#   tests/gpu/profile_check.sh <build-dir>
set -u
B=${1:?usage: tests/gpu/profile_check.sh <build-dir>}
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
OUT=$T/profile.txt
M=$T/kjv-tiny.ogp
"$B/offgraph" export "$SRC/models/kjv-tiny" -o "$M" >"$T/export.log" 2>&1 || { cat "$T/export.log"; exit 1; }
for _ in 1 2; do
    OG_CUDA_PROFILE=$OUT "$B/offgraph" bench -m "$M" --backend cuda --prompt 16 --gen 8 >/dev/null || exit 1
done
shape=$("$B/offgraph" inspect "$M" | sed -n 's/^model: .*hidden \([0-9]*\),.* \([0-9]*\) layers.*/\1 \2/p')
vocab=$("$B/offgraph" inspect "$M" | sed -n 's/^model: [a-z0-9_]*, vocab \([0-9]*\),.*/\1/p')
python3 - "$OUT" $shape "$vocab" <<'PY'
import re, sys
path, hidden, layers, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tables, cur = [], None
for line in open(path):
    line = line.rstrip("\n")
    m = re.match(r"# CUDA device time: (\d+) steps? of (\d+) sessions?, (\d+) rows?: ([0-9.]+) us a step", line)
    if m:
        cur = {"steps": int(m[1]), "sessions": int(m[2]), "rows": int(m[3]), "us": float(m[4]), "rows_": []}
        tables.append(cur)
    elif cur is not None and line and not line.startswith("launch step"):
        label, per, us, share, gbs = line.rsplit(None, 4)
        cur["rows_"].append((label, float(per), float(us), float(share.rstrip("%")), gbs))
fails = []
decode = [t for t in tables if t["sessions"] == 1 and t["rows"] == 1]
if len(decode) != 2:
    fails.append(f"{len(decode)} one-session decode tables, expected 2 (one per model load, appended)")
for t in decode:
    if t["steps"] < 8:
        fails.append(f"{t['steps']} decode steps profiled, expected at least the 8 timed ones")
    att = [r for r in t["rows_"] if r[0] == "update_and_attend"]
    if not att or abs(att[0][1] - layers) > 1e-9:
        fails.append(f"update_and_attend launches a step: {att[0][1] if att else 'none'}, expected {layers} (layers)")
    head = [r for r in t["rows_"] if re.search(rf"matmul {hidden}->{vocab}\b", r[0])]
    if len(head) != 1 or head[0][1] != 1.0 or not head[0][4].isdigit():
        fails.append(f"the head's product ({hidden}->{vocab}): {head}")
    total = sum(r[3] for r in t["rows_"])
    if abs(total - 100) > 1.0:
        fails.append(f"shares sum to {total:.1f} %")
    if abs(sum(r[2] for r in t["rows_"]) - t["us"]) > 0.01 * t["us"] + 1:
        fails.append("the rows' microseconds do not sum to the step's")
print(open(path).read())
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
PY
