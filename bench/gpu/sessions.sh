# Sourced by bench/gpu/moe.sh and bench/gpu/hybrid.sh: decode rows of one
# program at each session count of $KS (context $CTX, $GEN generated), the
# one-session row against a floor in tok/s, each result's JSON appended to a
# file. Needs $B (a build folder), $KS, $CTX, $GEN. The sessions step on the
# direct path (--direct), as the earlier rows of bench/gpu/notes.md did
# (without it, the engine's: a round of prompts, then a round of decodes).
#   session_rows LABEL PROGRAM FLOOR JSONL
field() { echo "$1" | grep -o "\"$2\":[0-9.]*" | cut -d: -f2; }
session_rows() {
    local label=$1 prog=$2 floor=$3 jsonl=$4 k r a e ratio
    for k in $KS; do
        r=$("$B/offgraph" bench -m "$prog" --backend cuda --json --prompt "$CTX" --gen "$GEN" --sessions "$k" --direct)
        a=$(field "$r" decode_tokens_per_s)
        e=$(field "$r" decode_tokens_per_s_per_session)
        ratio=$([ "$k" = 1 ] && awk -v a="$a" -v f="$floor" 'BEGIN { printf "%.0f%%", 100 * a / f }' || echo "")
        printf '%-10s %-5s %12s %12s %10s %8s\n' "$label" "$k" "$a" "$e" "$floor" "$ratio"
        echo "$r" >>"$jsonl"
    done
}
