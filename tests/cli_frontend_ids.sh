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
. "$SRC/tests/python/sanitizer_env.sh"
og_python_sanitizer_env "$BUILD" cli_frontend_ids || exit 77
RUN=(env "${SAN_ENV[@]}")
exec "${RUN[@]}" python3 "$SRC/tests/python/check_frontend_ids.py" "$BIN" "$WORK" "$SRC"
