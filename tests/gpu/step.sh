# Sourced by the GPU scripts that split their work into timed steps
# (tests/gpu/attend.sh, gemv.sh, kquant.sh, moe_gemm.sh): step runs a command
# under a time limit, its output into $OUT/<name>.log, and adds a line to
# the summary array that the script prints last.
summary=()
step() { # name, time limit in seconds, command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$? state
    case $rc in 0) state=ok ;; 77) state=skipped ;; 124) state="TIMED OUT (${limit}s)" ;; *) state="FAIL (rc $rc)" ;; esac
    summary+=("$(printf '%-22s %-18s %4ds' "$name" "$state" $((SECONDS - t0)))")
}
