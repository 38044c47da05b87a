#!/usr/bin/env bash
# Runs every libFuzzer harness of a fuzz build for the given seconds.
# Usage: scripts/fuzz.sh <build-dir> <seconds> [--merge]
# Each harness fuzz_<name> starts from a scratch copy of tests/fuzz/corpus/<name>/;
# with --merge, new interesting inputs are merged back into that folder.
# Crashers are kept in <build-dir>/fuzz-artifacts/<name>/. Prints executions
# and crashes per harness; exits 1 if any harness crashed, exited with an
# error, ran no input, or if a harness of tests/fuzz/ was not built. Each
# harness first replays its whole corpus (libFuzzer runs every file of the
# folder it is given before it mutates any), so a corpus input that crashes
# fails the run. The harnesses run side by side, so the whole run takes about
# <seconds> past the replay.
set -euo pipefail
build=${1:?usage: fuzz.sh <build-dir> <seconds> [--merge]}
seconds=${2:?usage: fuzz.sh <build-dir> <seconds> [--merge]}
merge=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
run_one() { # <binary>: fuzz it, then print one line (and the log tail on a crash)
  local bin=$1 name seeds work artifacts log execs crashes rc=0
  name=$(basename "$bin"); name=${name#fuzz_}
  seeds=$root/tests/fuzz/corpus/$name
  work=$(mktemp -d)
  artifacts=$build/fuzz-artifacts/$name
  mkdir -p "$work/corpus" "$artifacts"
  [[ -d $seeds ]] && cp "$seeds"/* "$work/corpus/" 2>/dev/null || true
  log=$work/log
  touch "$work/start" # crashers of earlier runs stay in $artifacts but are not counted again
  "$bin" "$work/corpus" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
         -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  crashes=$(find "$artifacts" -type f -newer "$work/start" | wc -l)
  echo "fuzz_$name: ${execs:-0} executions in ${seconds} s, $crashes crashes, exit status $rc (artifacts in $artifacts)"
  ((crashes == 0 && rc == 0 && ${execs:-0} > 0)) || tail -n 40 "$log"
  if [[ $merge == --merge && -d $seeds ]]; then
    "$bin" -merge=1 "$seeds" "$work/corpus" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
  ((crashes == 0 && rc == 0 && ${execs:-0} > 0))
}
pids=()
status=0
for src in "$root"/tests/fuzz/fuzz_*.c; do
  bin=$build/tests/fuzz/$(basename "$src" .c)
  if [[ ! -x $bin || ! -f $bin ]]; then
    echo "$(basename "$bin"): not built in $build" >&2
    status=1
    continue
  fi
  run_one "$bin" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
