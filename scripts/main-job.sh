#!/usr/bin/env bash
# The README's main job. Until `offgraph run` exists it demonstrates the
# off-graph KV manager: several sessions on one configuration.
set -euo pipefail
build=${1:-build}
exec "$build/offgraph" demo
