# Sourced by the tests that run python3 over this build's liboffgraph.so. A
# sanitizer build's library needs its runtime loaded first: the interpreter
# runs with the compiler's ASan / UBSan / TSan runtime preloaded and Python's
# allocator off, so that LeakSanitizer sees every block the library hands
# out and the bindings must give back (a leak fails the run).
#   og_python_sanitizer_env BUILD NAME
# sets SAN (the build's OG_SANITIZE, maybe empty) and SAN_ENV (an array of
# VAR=value words for `env`, empty for a plain build); returns 77 after a
# "skipped" line naming NAME when a runtime the build needs is not found.
og_python_sanitizer_env() {
    local build=$1 name=$2 cc pre= rt f
    SAN=$(sed -n 's/^OG_SANITIZE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null)
    SAN_ENV=()
    [ -n "$SAN" ] || return 0
    cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
    for rt in asan:address ubsan:undefined tsan:thread; do
        case ",$SAN," in *",${rt#*:},"*) ;; *) continue ;; esac
        f=$("${cc:-cc}" -print-file-name="lib${rt%%:*}.so" 2>/dev/null)
        case "$f" in /*) [ -f "$f" ] && pre="$pre $f" && continue ;; esac
        echo "$name: sanitizer build ($SAN) whose lib${rt%%:*}.so runtime ${cc:-cc} does not name: skipped"
        return 77
    done
    SAN_ENV=(LD_PRELOAD="${pre# }" PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=1:${ASAN_OPTIONS:-}
             UBSAN_OPTIONS=print_stacktrace=1:${UBSAN_OPTIONS:-})
}
