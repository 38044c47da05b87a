#!/usr/bin/env bash
# The installed library, as a program that uses it sees it: `cmake --install`
# (what `make install PREFIX=...` runs) into a scratch prefix, and staged
# under DESTDIR; examples/generate.c compiled against that prefix with
# pkg-config and as a CMake project with find_package(offgraph), each linked
# once to the shared library and once to the static one; all four run on the
# demo model, and their greedy continuation equals what `offgraph run --temp 0`
# prints after the prompt. The shared library's consumers link -loffgraph
# alone, and the installed library exports exactly the header's functions
# (scripts/check_exports.sh). The installed offgraph runs the demo model
# installed under its prefix. Every step is bounded.
# Args: the built offgraph, a scratch folder.
set -u
BIN=$1
WORK=$2
SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=$(cd "$(dirname "$BIN")" && pwd)
DEMO=$BUILD/kjv-tiny.ogp
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# A sanitizer build's library needs its runtime loaded first: not for plain programs.
if grep -qE '^OG_SANITIZE:STRING=.+' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "skipped: sanitizer build"
    exit 77
fi
command -v cc >/dev/null && command -v pkg-config >/dev/null || { echo "skipped: no cc or pkg-config"; exit 77; }
[ -f "$DEMO" ] || { echo "FAIL: no demo model at $DEMO"; exit 1; }

PREFIX=$WORK/prefix
timeout 120 cmake --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" 2>&1 || fail "install: $(tail -5 "$WORK/install.log")"
for f in lib/liboffgraph.a lib/liboffgraph.so lib/liboffgraph.so.0 include/offgraph.h bin/offgraph \
         lib/pkgconfig/offgraph.pc lib/cmake/offgraph/offgraphConfig.cmake lib/cmake/offgraph/offgraphConfigVersion.cmake; do
    [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
soname=$(readelf -d "$PREFIX/lib/liboffgraph.so" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
major=$(sed -n 's/^#define OG_VERSION_MAJOR \([0-9]*\)/\1/p' "$SRC/include/offgraph.h")
[ "$soname" = "liboffgraph.so.$major" ] || fail "SONAME is '$soname', want liboffgraph.so.$major"
"$PREFIX/bin/offgraph" --version >/dev/null 2>&1 || fail "the installed tool does not run"

# DESTDIR stages the same tree under another root.
DESTDIR="$WORK/stage" timeout 120 cmake --install "$BUILD" --prefix /opt/offgraph >/dev/null 2>&1 ||
    fail "install with DESTDIR"
[ -e "$WORK/stage/opt/offgraph/lib/pkgconfig/offgraph.pc" ] || fail "DESTDIR: nothing staged under $WORK/stage/opt/offgraph"

PROMPT="In the beginning"
N=24
want=$(timeout 120 "$BIN" run -m "$DEMO" -p "$PROMPT" -n $N --temp 0 2>"$WORK/run.err") || fail "offgraph run: $(cat "$WORK/run.err")"

# The installed offgraph runs the demo model installed beside it
# (share/offgraph/kjv-tiny.ogp) when no -m is given, from any folder; the
# prefix moved elsewhere, it reads the moved one (a file there that is not
# a program fails naming that path), not the build's.
[ -e "$PREFIX/share/offgraph/kjv-tiny.ogp" ] || fail "not installed: share/offgraph/kjv-tiny.ogp"
got=$(cd / && timeout 120 "$PREFIX/bin/offgraph" run -p "$PROMPT" -n $N --temp 0 2>"$WORK/inst.err") ||
    fail "installed offgraph run without -m: $(cat "$WORK/inst.err")"
[ "$got" = "$want" ] || fail "installed offgraph run without -m gave '$got', the build's demo '$want'"
cp -r "$PREFIX" "$WORK/moved"
echo "not a program" >"$WORK/moved/share/offgraph/kjv-tiny.ogp"
(cd / && timeout 120 "$WORK/moved/bin/offgraph" run -p "$PROMPT" -n 2 >/dev/null 2>"$WORK/moved.err") &&
    fail "a moved prefix with a broken demo model ran"
grep -q "cannot load .*/moved/bin/../share/offgraph/kjv-tiny.ogp" "$WORK/moved.err" ||
    fail "a moved prefix: not its own demo model read: $(cat "$WORK/moved.err")"

# Checks one build of the example: runs it and compares session 1's text.
check_example() {
    local exe=$1 how=$2
    timeout 120 "$exe" "$DEMO" "$PROMPT" $N >"$WORK/$how.out" 2>"$WORK/$how.err" ||
        { fail "$how: the example failed: $(cat "$WORK/$how.err")"; return; }
    grep -q '^--- session 2' "$WORK/$how.out" || fail "$how: no second session"
    local greedy
    greedy=$(sed -n '/^--- session 1/,/^--- session 2/{/^--- session/d;p}' "$WORK/$how.out")
    [ -n "$greedy" ] || fail "$how: session 1 printed nothing"
    [ "$PROMPT$greedy" = "$want" ] || fail "$how: session 1 gave '$greedy'; offgraph run gave '$want'"
}

# 1. pkg-config (the shared library; the rpath finds it in the scratch prefix)
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
if timeout 300 cc -std=c11 -Wall -Wextra -Werror "$SRC/examples/generate.c" -o "$WORK/generate_pc" \
        $(pkg-config --cflags --libs offgraph) -Wl,-rpath,"$PREFIX/lib" >"$WORK/cc.log" 2>&1; then
    readelf -d "$WORK/generate_pc" | grep -q "NEEDED.*liboffgraph.so.$major" || fail "pkg-config: not linked to the shared library"
    check_example "$WORK/generate_pc" pkg-config
else
    fail "cc with pkg-config: $(head -20 "$WORK/cc.log")"
fi

# The dependencies are the library's own business: a program linking the
# shared library is given -loffgraph alone and the prefix's include folder
# (they are Libs.private), needs none of them itself, and needs none of their
# pkg-config files (PKG_CONFIG_LIBDIR hides the system's: the offgraph.pc
# of the prefix is all pkg-config sees).
cflags=$(PKG_CONFIG_LIBDIR=$PREFIX/lib/pkgconfig pkg-config --cflags offgraph 2>&1) ||
    fail "pkg-config --cflags offgraph without the system's .pc files: $cflags"
[ "$(echo $cflags)" = "-I$PREFIX/lib/pkgconfig/../../include" ] || fail "pkg-config --cflags offgraph gives '$cflags'"
libs=$(PKG_CONFIG_LIBDIR=$PREFIX/lib/pkgconfig pkg-config --libs offgraph 2>&1) ||
    fail "pkg-config --libs offgraph without the system's .pc files: $libs"
for dep in cjson openblas pcre2 utf8proc microhttpd xxhash; do
    case " $libs " in *"-l$dep"*) fail "pkg-config --libs offgraph names -l$dep: '$libs'" ;; esac
    if [ -x "$WORK/generate_pc" ] && readelf -d "$WORK/generate_pc" | grep -q "NEEDED.*lib$dep"; then
        fail "pkg-config: the example itself needs lib$dep"
    fi
done
# The installed library exports exactly the header's functions.
bash "$SRC/scripts/check_exports.sh" "$PREFIX/lib/liboffgraph.so" "$PREFIX/include/offgraph.h" >"$WORK/exports.log" 2>&1 ||
    fail "the installed library's exports: $(head -20 "$WORK/exports.log")"

# 2. pkg-config --static: the archive (-l:liboffgraph.a) and the private dependencies
static_libs=$(pkg-config --static --libs offgraph | sed 's/-loffgraph\b/-l:liboffgraph.a/')
if timeout 300 cc -std=c11 -Wall -Wextra -Werror "$SRC/examples/generate.c" -o "$WORK/generate_static" \
        $(pkg-config --cflags offgraph) $static_libs >"$WORK/cc-static.log" 2>&1; then
    readelf -d "$WORK/generate_static" | grep -q "NEEDED.*liboffgraph" && fail "pkg-config --static: linked to the shared library"
    check_example "$WORK/generate_static" pkg-config-static
else
    fail "cc with pkg-config --static: $(head -20 "$WORK/cc-static.log")"
fi

# 3. CMake: find_package(offgraph), targets offgraph::offgraph and offgraph::offgraph_static
mkdir -p "$WORK/cmake-project"
cat >"$WORK/cmake-project/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(og_example LANGUAGES C)
find_package(offgraph 0 REQUIRED)
add_executable(generate $SRC/examples/generate.c)
target_link_libraries(generate PRIVATE offgraph::offgraph)
add_executable(generate_static $SRC/examples/generate.c)
target_link_libraries(generate_static PRIVATE offgraph::offgraph_static)
CM
if timeout 300 cmake -S "$WORK/cmake-project" -B "$WORK/cmake-build" -DCMAKE_PREFIX_PATH="$PREFIX" \
        -DCMAKE_BUILD_TYPE=Release >"$WORK/cmake.log" 2>&1 &&
   timeout 300 cmake --build "$WORK/cmake-build" >>"$WORK/cmake.log" 2>&1; then
    check_example "$WORK/cmake-build/generate" cmake
    readelf -d "$WORK/cmake-build/generate_static" | grep -q "NEEDED.*liboffgraph" &&
        fail "CMake offgraph::offgraph_static: linked to the shared library"
    check_example "$WORK/cmake-build/generate_static" cmake-static
else
    fail "the CMake project: $(tail -20 "$WORK/cmake.log")"
fi

if [ $fails -gt 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "ok: installed library built with pkg-config and with CMake, shared and static, example output checked"
