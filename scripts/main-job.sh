#!/usr/bin/env bash
# The README's main job: the demo model (models/kjv-tiny, exported by the
# build) continues a prompt on the CPU, streaming the text, then prints the
# --stats line.
set -euo pipefail
build=${1:-build}
exec "$build/offgraph" run --backend cpu -p "And it came to pass, when the king" -n 96 --temp 0.7 --seed 7 --stats
