#!/usr/bin/env bash
# The ABI check: liboffgraph.so must export exactly the functions that
# include/offgraph.h declares, and the Python binding must bind only those.
#
#   scripts/check_exports.sh <liboffgraph.so> [offgraph.h] [python/offgraph/__init__.py]
#
# The header's rule (include/offgraph.h says it too): every public function
# is declared by a line that begins with `OG_API` (a declaration may go on
# over further lines); its name is the first identifier on that line that is
# immediately followed by `(`. Comments are ignored. Any other line at the
# start of a line outside a comment that looks like a function declaration
# (an identifier immediately followed by `(`), other than a typedef or
# `extern "C"`, is an error: a function declared without OG_API would be
# hidden by the library's -fvisibility=hidden.
#
# The library's side: `nm -D --defined-only`, every symbol but the few the
# toolchain defines (the linker's _init, _fini, _edata, _end, __bss_start;
# in sanitizer builds, the sanitizers' __asan_* / __odr_asan* / __ubsan_* /
# __sanitizer_* / __lsan_* / __tsan_* hooks). Each must
# be a declared function (type T), and each declared function must be there.
# Every name is printed on a difference, in either direction; exit 1 then.
#
# The binding's side: every `"og_name"` key and every `.og_name` call in the
# Python file must be declared.
set -u
LIB=${1:?usage: check_exports.sh <liboffgraph.so> [offgraph.h] [__init__.py]}
SRC=$(cd "$(dirname "$0")/.." && pwd)
HEADER=${2:-$SRC/include/offgraph.h}
PY=${3:-$SRC/python/offgraph/__init__.py}
command -v nm >/dev/null || { echo "skipped: no nm"; exit 77; }
[ -f "$LIB" ] || { echo "FAIL: no library at $LIB"; exit 1; }
[ -f "$HEADER" ] || { echo "FAIL: no header at $HEADER"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

# The header without its comments (block comments may span lines; // ones too).
awk '{
    out = ""; line = $0
    while (line != "") {
        if (inc) {
            i = index(line, "*/")
            if (i == 0) { line = ""; break }
            line = substr(line, i + 2); inc = 0
        } else {
            i = index(line, "/*"); j = index(line, "//")
            if (j > 0 && (i == 0 || j < i)) { out = out substr(line, 1, j - 1); line = ""; break }
            if (i == 0) { out = out line; line = ""; break }
            out = out substr(line, 1, i - 1) " "; line = substr(line, i + 2); inc = 1
        }
    }
    print out
}' "$HEADER" >"$TMP/header"

# Declared functions: lines beginning with OG_API.
awk '/^OG_API[ \t]/ {
        if (match($0, /[A-Za-z_][A-Za-z0-9_]*\(/)) print substr($0, RSTART, RLENGTH - 1)
        else print "unparsed declaration at line " NR ": " $0 > "/dev/stderr"
     }' "$TMP/header" 2>"$TMP/unparsed" | sort >"$TMP/declared"
if [ -s "$TMP/unparsed" ]; then
    echo "FAIL: $HEADER has OG_API lines without a function name:"; cat "$TMP/unparsed"; fails=$((fails + 1))
fi
dups=$(uniq -d "$TMP/declared")
[ -z "$dups" ] || { echo "FAIL: declared twice with OG_API:"; echo "$dups"; fails=$((fails + 1)); }
sort -u -o "$TMP/declared" "$TMP/declared"
[ -s "$TMP/declared" ] || { echo "FAIL: no OG_API declarations found in $HEADER"; exit 1; }

# Function-like declarations at the start of a line without OG_API.
awk '/^[A-Za-z_]/ && !/^OG_API[ \t]/ && !/^typedef[ \t]/ && !/^extern "C"/ && /[A-Za-z_][A-Za-z0-9_]*\(/ {
        print "  line " NR ": " $0
     }' "$TMP/header" >"$TMP/unmarked"
if [ -s "$TMP/unmarked" ]; then
    echo "FAIL: declarations in $HEADER without OG_API (they would not be exported):"
    cat "$TMP/unmarked"; fails=$((fails + 1))
fi

# What the library exports (dynamic symbols it defines).
nm -D --defined-only "$LIB" >"$TMP/nm" 2>"$TMP/nm.err" || { echo "FAIL: nm: $(cat "$TMP/nm.err")"; exit 1; }
awk 'NF >= 2 { name = $NF; sub(/@.*/, "", name)
               if (name ~ /^(_init|_fini|_edata|_end|__bss_start)$/) next
               if (name ~ /^__(asan|odr_asan|ubsan|sanitizer|lsan|tsan)/) next
               print name, $(NF - 1) }' "$TMP/nm" | sort -u >"$TMP/exported_typed"
awk '{print $1}' "$TMP/exported_typed" | sort -u >"$TMP/exported"

missing=$(comm -23 "$TMP/declared" "$TMP/exported")
extra=$(comm -13 "$TMP/declared" "$TMP/exported")
if [ -n "$missing" ]; then
    echo "FAIL: declared in $(basename "$HEADER") but not exported by $(basename "$LIB"):"
    echo "$missing" | sed 's/^/  /'; fails=$((fails + 1))
fi
if [ -n "$extra" ]; then
    echo "FAIL: exported by $(basename "$LIB") but not declared with OG_API in $(basename "$HEADER"):"
    grep -Fwf <(echo "$extra") "$TMP/exported_typed" | sed 's/^/  /'; fails=$((fails + 1))
fi
notfn=$(awk '$2 != "T" {print "  " $0}' "$TMP/exported_typed" | grep -Fwf "$TMP/declared")
[ -z "$notfn" ] || { echo "FAIL: declared functions exported as something else than code (T):"; echo "$notfn"; fails=$((fails + 1)); }

# The Python binding binds only declared functions.
if [ -f "$PY" ]; then
    grep -oE '"og_[a-z0-9_]+"|\.og_[a-z0-9_]+' "$PY" | tr -d '".' | sort -u >"$TMP/bound"
    unbound=$(comm -23 "$TMP/bound" "$TMP/declared")
    if [ -n "$unbound" ]; then
        echo "FAIL: $(basename "$PY") uses functions $(basename "$HEADER") does not declare:"
        echo "$unbound" | sed 's/^/  /'; fails=$((fails + 1))
    fi
    nbound=$(wc -l <"$TMP/bound")
else
    nbound=0
fi

[ $fails -eq 0 ] || exit 1
echo "ok: $(wc -l <"$TMP/declared") functions declared with OG_API, the same $(wc -l <"$TMP/exported") exported;" \
     "the Python binding uses $nbound of them"
