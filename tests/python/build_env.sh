# Sourced by the tests that run python3 over this build (tests/cli_python.sh,
# tests/cli_python_tools.sh) with their arguments, the built offgraph and a
# scratch folder:
#   og_python_build_env BIN WORK
# sets BIN (the built offgraph, as an absolute path), WORK, SRC (the source
# tree: $OG_SOURCE_DIR, else the folder above tests/) and BUILD (the build
# folder, absolute: its liboffgraph.so and demo model).
og_python_build_env() {
    BIN=$1
    WORK=$2
    SRC=${OG_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
    BUILD=$(cd "$(dirname "$BIN")" && pwd)
    BIN=$BUILD/$(basename "$BIN")
}
