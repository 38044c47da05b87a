#!/usr/bin/env bash
# Every front end (`offgraph run`, /v1/completions, /v1/chat/completions, the
# Python binding) feeds a prompt as the token ids transformers gives for it,
# for every case of tests/data/tokenizers/special_tokens.json (BOS and no
# BOS; tests/python/check_frontend_ids.py says how). Loopback only; the
# binding is imported from python/ with this build's liboffgraph.so.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
if ! command -v python3 >/dev/null; then
    echo "cli_frontend_ids: python3 is missing: skipped"
    exit 77
fi
BUILD=$(cd "$(dirname "$BIN")" && pwd)
export OFFGRAPH_LIB=${OFFGRAPH_LIB:-$BUILD/liboffgraph.so}
# A sanitizer build's library needs its runtime loaded first (as
# tests/cli_python.sh does): the interpreter runs with it preloaded.
SAN=$(sed -n 's/^OG_SANITIZE:STRING=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
RUN=(env)
if [ -n "$SAN" ]; then
    cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
    pre=
    for rt in asan:address ubsan:undefined tsan:thread; do
        case ",$SAN," in *",${rt#*:},"*) ;; *) continue ;; esac
        f=$("${cc:-cc}" -print-file-name="lib${rt%%:*}.so" 2>/dev/null)
        case "$f" in /*) [ -f "$f" ] && pre="$pre $f" && continue ;; esac
        echo "cli_frontend_ids: sanitizer build ($SAN) whose lib${rt%%:*}.so runtime ${cc:-cc} does not name: skipped"
        exit 77
    done
    RUN=(env LD_PRELOAD="${pre# }" PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=1:${ASAN_OPTIONS:-}
         UBSAN_OPTIONS=print_stacktrace=1:${UBSAN_OPTIONS:-})
fi
exec "${RUN[@]}" python3 "$SRC/tests/python/check_frontend_ids.py" "$BIN" "$WORK" "$SRC"
