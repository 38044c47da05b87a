#!/usr/bin/env bash
# The README's main job (see README.md).
set -euo pipefail
build=${1:-build}
exec "$build/offgraph" --help
