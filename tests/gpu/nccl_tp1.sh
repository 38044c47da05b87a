#!/usr/bin/env bash
# Tensor parallel's NCCL path at N = 1 on one GPU (src/exec/nccl_cuda.c,
# OG_CUDA_NCCL=1): the all-reduces the shard planner puts after each
# row-parallel product, enqueued on the step's stream and captured into the
# decode graphs, must change no bit: fixtures of tests/data/hf (dense, MoE,
# hybrid) in f32 and bf16, fed one token a step (decode graphs) and whole,
# give the plain CUDA path's logits exactly. Without NCCL on the loader's
# path the model load must fail naming libnccl.so.2. --devices 0 gives the
# same logits as no --devices, and a device the machine lacks is refused.
# NCCL is looked for where the CUDA toolkit and Python's CUDA wheels (torch's
# nvidia-nccl) put it. Args: a folder made by tests/gpu/pack.sh.
set -u
B=$(cd "${1:?usage: tests/gpu/nccl_tp1.sh <build-dir>}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
NCCL=
for d in ${LD_LIBRARY_PATH//:/ } /usr/local/cuda/lib64 /usr/local/cuda*/lib64 /usr/lib/x86_64-linux-gnu \
    $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | tr ' ' '\n' | sed 's|$|/nvidia/nccl/lib|'); do
    [ -f "$d/libnccl.so.2" ] && NCCL=$d && break
done
if [ -z "$NCCL" ]; then
    echo "no libnccl.so.2 found: skipped"
    exit 77
fi
echo "NCCL from $NCCL"
fails=0
for name in llama-gqa qwen3-moe qwen35-dense; do
    for dtype in f32 bf16; do
        prog=$WORK/$name.$dtype.ogp
        "$B/offgraph" export "$SRC/tests/data/hf/$name" -o "$prog" --max-write 8 --dtype "$dtype" >/dev/null 2>&1 || {
            echo "FAIL $name $dtype: export"
            fails=$((fails + 1))
            continue
        }
        rows=$(tr ',' '\n' <"$SRC/tests/data/hf/$name/tokens.txt" | grep -c .)
        for chunk in 1 whole; do
            args=(eval -m "$prog" --tokens "@$SRC/tests/data/hf/$name/tokens.txt" --backend cuda)
            [ "$chunk" = whole ] || args+=(--chunk "$chunk")
            if ! "$B/offgraph" "${args[@]}" --logits-out "$WORK/plain.f32" 2>"$WORK/log" ||
                ! LD_LIBRARY_PATH=$NCCL:${LD_LIBRARY_PATH:-} OG_CUDA_NCCL=1 "$B/offgraph" "${args[@]}" \
                    --logits-out "$WORK/nccl.f32" 2>>"$WORK/log"; then
                echo "FAIL $name $dtype chunk=$chunk: $(cat "$WORK/log")"
                fails=$((fails + 1))
            elif res=$("$B/tests/compare_logits" "$WORK/nccl.f32" "$WORK/plain.f32" "$rows" 0); then
                echo "ok   $name $dtype chunk=$chunk: $res"
            else
                echo "FAIL $name $dtype chunk=$chunk: $res"
                fails=$((fails + 1))
            fi
        done
    done
done
# without the library on the path (the pack's own libraries stay on it): refused by name
if env LD_LIBRARY_PATH="$B/lib" OG_CUDA_NCCL=1 "$B/offgraph" eval -m "$WORK/llama-gqa.f32.ogp" --tokens 1,2 --backend cuda \
    --logits-out "$WORK/x.f32" 2>"$WORK/log"; then
    echo "note: loaded with only $B/lib on LD_LIBRARY_PATH (libnccl.so.2 is on the loader's default path)"
elif ! grep -q "libnccl.so.2" "$WORK/log"; then
    echo "FAIL: without NCCL: $(cat "$WORK/log")"
    fails=$((fails + 1))
fi
# --devices: device 0 named gives the logits of no device named; a device
# past the machine's is refused naming how many it has
prog=$WORK/llama-gqa.f32.ogp
toks="@$SRC/tests/data/hf/llama-gqa/tokens.txt"
if ! "$B/offgraph" eval -m "$prog" --tokens "$toks" --backend cuda --logits-out "$WORK/plain.f32" 2>"$WORK/log" ||
    ! "$B/offgraph" eval -m "$prog" --tokens "$toks" --devices 0 --logits-out "$WORK/dev0.f32" 2>>"$WORK/log" ||
    ! cmp -s "$WORK/plain.f32" "$WORK/dev0.f32"; then
    echo "FAIL --devices 0: $(cat "$WORK/log")"
    fails=$((fails + 1))
else
    echo "ok   --devices 0: the same logits"
fi
if "$B/offgraph" eval -m "$prog" --tokens 1,2 --devices 99 --logits-out "$WORK/x.f32" 2>"$WORK/log" ||
    ! grep -q "device 99: this machine has" "$WORK/log"; then
    echo "FAIL --devices 99: $(cat "$WORK/log")"
    fails=$((fails + 1))
else
    echo "ok   --devices 99 refused: $(head -1 "$WORK/log")"
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
