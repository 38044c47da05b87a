#!/usr/bin/env bash
# The Python package (python/) as a user installs it: `cd python && pip
# install .` into a fresh plain venv (no system site packages, no wheel
# package), offline (--no-index); the in-tree build backend builds
# liboffgraph.so with cmake (here: this build's folder, up to date) and puts
# it inside the wheel. Then `import offgraph` with no environment variable
# must load the wheel's copy, and tests/python/check_bindings.py runs on it
# against the demo model: ids and greedy text against Hugging Face's
# (models/kjv-tiny/golden.json) and against `offgraph tokenize` /
# `detokenize` / `run` (greedy and sampled), the Llama-style API against
# `offgraph run` and a JSON-schema validator, two sessions in one batched
# step against each stepped alone, fork/save/restore, errors. The other ways
# the package finds the library: OFFGRAPH_LIB, the dynamic loader.
# The interpreter: $OG_PYTHON if set, else Debian's /usr/bin/python3, else
# python3 on PATH: the first that makes a venv with pip.
# Args: the built offgraph, a scratch folder.
set -u
. "$(dirname "$0")/python/build_env.sh"
og_python_build_env "$@"
DEMO=$BUILD/kjv-tiny.ogp
rm -rf "$WORK" && mkdir -p "$WORK"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PYTHONDONTWRITEBYTECODE=1

. "$SRC/tests/python/sanitizer_env.sh"
og_python_sanitizer_env "$BUILD" cli_python || exit 77
RUN=(env "${SAN_ENV[@]}")
[ -z "$SAN" ] || echo "sanitizer build ($SAN): python runs with ${SAN_ENV[0]}"
major=$(sed -n 's/^#define OG_VERSION_MAJOR \([0-9]*\)/\1/p' "$SRC/include/offgraph.h")
minor=$(sed -n 's/^#define OG_VERSION_MINOR \([0-9]*\)/\1/p' "$SRC/include/offgraph.h")
LIB=$BUILD/liboffgraph.so.$major
[ -f "$DEMO" ] || { echo "FAIL: no demo model at $DEMO"; exit 1; }
[ -f "$LIB" ] || { echo "FAIL: no shared library at $LIB"; exit 1; }

VENV=$WORK/venv
PY=
for cand in ${OG_PYTHON:-} /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    rm -rf "$VENV"
    if timeout 120 "$cand" -m venv "$VENV" >"$WORK/venv.log" 2>&1 &&
       timeout 60 "$VENV/bin/python" -m pip --version >>"$WORK/venv.log" 2>&1; then
        PY=$cand
        break
    fi
done
if [ -z "$PY" ]; then
    echo "skipped: no python3 makes a venv with pip (scripts/install-deps.sh installs python3-venv): " \
         "$(tail -3 "$WORK/venv.log" 2>/dev/null)"
    exit 77
fi
echo "python: $PY ($("$VENV/bin/python" --version 2>&1))"
# a plain venv: no system packages, and not the wheel package (the build
# backend, python/_offgraph_build.py, needs neither setuptools nor wheel)
"$VENV/bin/python" -c 'import wheel' >/dev/null 2>&1 && fail "the fresh venv has the wheel package"

# `cd python && pip install .`, offline (--no-index; the build's isolated
# environment needs nothing), reusing this build's cmake folder: the backend
# runs cmake --build there (up to date) and bundles its liboffgraph.so.
listing() { (cd "$SRC/python" && find . -name __pycache__ -prune -o -print | sort); }
before=$(listing)
if ! (cd "$SRC/python" && timeout 600 env -u OFFGRAPH_LIB "$VENV/bin/python" -m pip install --no-index \
        --no-cache-dir --config-settings "build-dir=$BUILD" . >"$WORK/pip.log" 2>&1); then
    fail "pip install: $(tail -20 "$WORK/pip.log")"
    echo "$fails failure(s)"
    exit 1
fi
[ "$(listing)" = "$before" ] || fail "pip install left files in python/: $(diff <(echo "$before") <(listing))"
site=$(cd "$WORK" && env -u OFFGRAPH_LIB "$VENV/bin/python" -c 'import offgraph, os; print(os.path.dirname(offgraph.__file__))')
case "$site" in "$VENV"/*) ;; *) fail "offgraph is imported from '$site', not the venv" ;; esac
ver=$(cd "$WORK" && env -u OFFGRAPH_LIB "$VENV/bin/python" -c 'import offgraph; print(offgraph.__version__, offgraph.ABI_MAJOR)')
[ "$ver" = "$major.$minor $major" ] || fail "the package says '$ver'; offgraph.h is $major.$minor"
cmp -s "$site/liboffgraph.so.$major" "$LIB" || fail "the wheel's $site/liboffgraph.so.$major is not this build's $LIB"

# where the library is found: with no environment variable, the copy in the
# wheel (a model loads and generates)
where() { (cd "$WORK" && env -u OFFGRAPH_LIB "$@" timeout 60 "${RUN[@]}" "$VENV/bin/python" -c \
    'import offgraph; m = offgraph.Model("'"$DEMO"'", backend="cpu"); print(offgraph.library_path()); m.close()' 2>&1); }
got=$(where)
[ "$got" = "$site/liboffgraph.so.$major" ] || fail "with no OFFGRAPH_LIB: loaded '$got', not the wheel's copy"
got=$(where OFFGRAPH_LIB="$LIB")
[ "$got" = "$LIB" ] || fail "with OFFGRAPH_LIB: loaded '$got'"
got=$(cd "$WORK" && OFFGRAPH_LIB=$WORK/none.so timeout 60 "${RUN[@]}" "$VENV/bin/python" -c 'import offgraph; offgraph.library_path()' 2>&1)
printf '%s' "$got" | grep -q "OffgraphError: OFFGRAPH_LIB=$WORK/none.so cannot be loaded" ||
    fail "a bad OFFGRAPH_LIB: '$got'"
# the package's sources without a library beside them: the dynamic loader's
got=$(where PYTHONPATH="$SRC/python" LD_LIBRARY_PATH="$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
[ "$got" = "liboffgraph.so.$major" ] || fail "with LD_LIBRARY_PATH: loaded '$got', want the loader's liboffgraph.so.$major"

# the checks against the references, with the wheel's library
(cd "$WORK" && env -u OFFGRAPH_LIB timeout 600 "${RUN[@]}" "$VENV/bin/python" "$SRC/tests/python/check_bindings.py" \
    "$BIN" "$DEMO" "$SRC/models/kjv-tiny/golden.json" "$WORK" "$SRC") || fail "tests/python/check_bindings.py"

if [ $fails -gt 0 ]; then
    echo "$fails failure(s)"
    exit 1
fi
echo "ok: pip install into a plain venv ($PY), offline; the wheel's library found with no environment; bindings checked"
