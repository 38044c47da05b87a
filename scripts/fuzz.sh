#!/usr/bin/env bash
# Runs every libFuzzer harness of a fuzz build for the given seconds.
# Usage: scripts/fuzz.sh <build-dir> <seconds> [--merge]
# Each harness fuzz_<name> starts from a scratch copy of tests/fuzz/corpus/<name>/;
# with --merge, new interesting inputs are merged back into that folder.
# Crashers are kept in <build-dir>/fuzz-artifacts/<name>/. Prints executions
# and crashes per harness; exits 1 if any harness crashed.
set -euo pipefail
build=${1:?usage: fuzz.sh <build-dir> <seconds> [--merge]}
seconds=${2:?usage: fuzz.sh <build-dir> <seconds> [--merge]}
merge=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
status=0
shopt -s nullglob
for bin in "$build"/tests/fuzz/fuzz_*; do
  [[ -x $bin && -f $bin ]] || continue
  name=$(basename "$bin"); name=${name#fuzz_}
  seeds=$root/tests/fuzz/corpus/$name
  work=$(mktemp -d)
  artifacts=$build/fuzz-artifacts/$name
  mkdir -p "$work/corpus" "$artifacts"
  [[ -d $seeds ]] && cp "$seeds"/* "$work/corpus/" 2>/dev/null || true
  log=$work/log
  "$bin" "$work/corpus" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
         -artifact_prefix="$artifacts/" >"$log" 2>&1 || true
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  crashes=$(ls "$artifacts" | wc -l)
  echo "fuzz_$name: ${execs:-0} executions, $crashes crashes (artifacts in $artifacts)"
  ((crashes == 0)) || { status=1; tail -n 40 "$log"; }
  if [[ $merge == --merge && -d $seeds ]]; then
    "$bin" -merge=1 "$seeds" "$work/corpus" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
done
exit $status
