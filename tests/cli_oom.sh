#!/usr/bin/env bash
# Out of memory outside the KV allocator: offgraph run (the demo model) and
# offgraph inspect under address-space limits (ulimit -v) from 64 MB up.
# At every level each command either succeeds (exit 0, with its output) or
# says what failed on stderr and exits 1: never a signal, a hang or another
# status. (Below about 60 MB the dynamic loader or OpenBLAS's load-time
# threads fail before main runs; that is outside this test.)
# Skipped in sanitizer builds, whose shadow memory needs far more address
# space than any of these limits.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
PROG=$(dirname "$BIN")/kjv-tiny.ogp
rm -rf "$WORK" && mkdir -p "$WORK"
if grep -q -a -e __asan_init -e __tsan_init "$BIN"; then
    echo "cli_oom: skipped (a sanitizer build)"
    exit 77
fi
[ -f "$PROG" ] || { echo "cli_oom: skipped (no demo program at $PROG)"; exit 77; }
fails=0
ran=0 # levels at which main ran (the dynamic loader mapped every library)
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# check <limit KB> <name> <expected stdout prefix> <command...>
check() {
    local kb=$1 name=$2 want=$3
    shift 3
    local out=$WORK/$name.$kb.out err=$WORK/$name.$kb.err rc
    (ulimit -v "$kb" && exec timeout 120 "$BIN" "$@") >"$out" 2>"$err"
    rc=$?
    if [ $rc = 127 ] && grep -q "error while loading shared libraries" "$err"; then
        # below the loader's floor (a CUDA build maps cuBLAS, hundreds of MB):
        # main never ran, which is outside this test
        printf '%-8s %5d MB: the dynamic loader cannot map the libraries\n' "$name" $((kb / 1024))
        return
    fi
    ran=$((ran + 1))
    case $rc in
    0) head -c ${#want} "$out" | grep -qF "$want" || fail "$name at $((kb / 1024)) MB: exit 0 but output: $(head -c 200 "$out")" ;;
    1) [ -s "$err" ] || fail "$name at $((kb / 1024)) MB: exit 1 with nothing on stderr"
       grep -qi -e sanitizer -e "runtime error" "$err" && fail "$name at $((kb / 1024)) MB: $(head -c 300 "$err")" ;;
    124) fail "$name at $((kb / 1024)) MB: hung (killed after 120 s)" ;;
    *) fail "$name at $((kb / 1024)) MB: exit status $rc: $(head -c 300 "$err")" ;;
    esac
    printf '%-8s %5d MB: exit %d %s\n' "$name" $((kb / 1024)) $rc "$(head -n 1 "$err" | cut -c 1-120)"
}

for mb in 64 72 96 128 192 256 512 1024 2048; do
    kb=$((mb * 1024))
    # one thread: where two threads call OpenBLAS's sgemm at once and its
    # second 128 MB buffer (its AVX2 builds') cannot be mapped, OpenBLAS spins
    # in blas_memory_alloc instead of failing (seen at 1024 MB on an AVX2
    # host); that is OpenBLAS's, outside what this test checks
    check $kb run "In the beginning" run -m "$PROG" -p "In the beginning" -n 8 --seed 1 -t 1
    check $kb inspect "file: " inspect "$PROG"
done

[ $ran -gt 0 ] || fail "the loader failed at every level: main never ran"
[ $fails -eq 0 ] && echo "cli_oom: ok ($ran runs)" || { echo "cli_oom: $fails failures"; exit 1; }
