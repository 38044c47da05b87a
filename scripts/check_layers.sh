#!/usr/bin/env bash
# The layering check: each folder of src/ uses only the folders docs/DESIGN.md
# section 1 lets it use (the table below is that section's "may use" column;
# change both together).
#
#   scripts/check_layers.sh [object folder]
#
# "Uses" is checked twice:
#  - includes: a line `#include "X/..."` in a file of src/F/ (any depth,
#    .c .h .cu .cuh) needs X == F or X in F's list;
#  - calls: when the object folder is given (the build's
#    CMakeFiles/offgraph.dir, where src/F/f.c is compiled to src/F/f.c.o),
#    every symbol an object of src/F/ leaves undefined and an object of
#    src/X/ defines needs X == F or X in F's list. This catches calls made
#    through include/offgraph.h, which no include line shows. Objects whose
#    source is gone (a stale build folder) are skipped.
# Every violation is printed with the file and the include or symbol; exit 1
# then. A folder of src/ missing from the table is a violation too.
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)/src
OBJ=${1:-}
export LC_ALL=C

declare -A MAY=(
    [core]=""
    [kv]="core"
    [kernels]="core kv"
    [program]="core kv"
    [exec]="core kv kernels program"
    [cache]="core kv program exec"
    [text]="core"
    [import]="core program text"
    [engine]="core kv program exec cache text"
    [serve]="core kv program exec cache text engine"
)

allowed() { [[ $1 == "$2" || " ${MAY[$1]-} " == *" $2 "* ]]; }

fail=0
for d in "$SRC"/*/; do
    d=$(basename "$d")
    if [[ ! -v MAY[$d] ]]; then
        echo "src/$d: a folder the layer table (scripts/check_layers.sh, docs/DESIGN.md section 1) does not name"
        fail=1
    fi
done

# includes: "file<TAB>line<TAB>target folder"
while IFS=$'\t' read -r file line to; do
    from=${file#"$SRC"/}
    from=${from%%/*}
    [[ -v MAY[$from] ]] || continue
    if ! allowed "$from" "$to"; then
        echo "src/${file#"$SRC"/}:$line: $from includes $to (allowed: ${MAY[$from]:-nothing})"
        fail=1
    fi
done < <(find "$SRC" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
         xargs -0 awk 'match($0, /^[ \t]*#[ \t]*include[ \t]*"[a-z_0-9]+\//) {
                           s = substr($0, RSTART, RLENGTH); sub(/.*"/, "", s); sub(/\/$/, "", s);
                           printf "%s\t%d\t%s\n", FILENAME, FNR, s }')

if [[ -n $OBJ ]]; then
    command -v nm >/dev/null || { echo "skipped: no nm"; exit 77; }
    [[ -d $OBJ/src ]] || { echo "no objects under $OBJ/src"; exit 1; }
    defs=$(mktemp) uses=$(mktemp)
    trap 'rm -f "$defs" "$uses"' EXIT
    n=0
    while IFS= read -r -d '' o; do
        rel=${o#"$OBJ"/src/}
        [[ -f $SRC/${rel%.o} ]] || continue # its source is gone
        folder=${rel%%/*}
        nm -g --defined-only "$o" | awk -v f="$folder" 'NF == 3 && $2 ~ /^[TDBRVW]$/ { print $3 "\t" f }' >> "$defs"
        nm -u "$o" | awk -v f="$folder" -v r="src/${rel%.o}" '{ print $NF "\t" f "\t" r }' >> "$uses"
        n=$((n + 1))
    done < <(find "$OBJ/src" -type f -name '*.o' -print0)
    [[ $n -gt 0 ]] || { echo "no objects under $OBJ/src"; exit 1; }
    sort -u -o "$defs" "$defs"
    sort -o "$uses" "$uses"
    # symbol, user folder, user file, defining folder
    while IFS=$'\t' read -r sym from file to; do
        [[ -v MAY[$from] ]] || continue
        if ! allowed "$from" "$to"; then
            echo "$file: $from calls $sym of $to (allowed: ${MAY[$from]:-nothing})"
            fail=1
        fi
    done < <(join -t $'\t' -j 1 "$uses" "$defs")
fi

[[ $fail == 0 ]] && echo "layers: every include${OBJ:+ and call} runs down the table"
exit $fail
