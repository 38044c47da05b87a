#!/usr/bin/env bash
# Builds the CUDA configuration and gathers what a machine with a GPU runs into
# <out-dir> (default build-gpu): the stripped offgraph tool, the GPU tests,
# compare_logits, the GPU benchmarks (and bench_threads, a CPU one that wants a
# quiet machine), and lib/ with the shared libraries from
# this system's packages that the binaries need beyond glibc, libstdc++ and
# the CUDA toolkit (which such a machine has). The CUDA driver is never
# copied. The build tree itself stays in <out-dir>.tree. The folder is also
# written compressed to build-pack/<out-dir name>.txz (about a twelfth of its
# size), for a copy to that machine that must stay small: unpack it there with
# `tar -xJf build-pack/<name>.txz`.
#   tests/gpu/pack.sh [out-dir]
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-build-gpu}
TREE=$OUT.tree
cmake -S "$SRC" -B "$TREE" -DOG_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$TREE" -j"${JOBS:-2}" --target offgraph_cli test_ops_cuda test_attend_cuda test_sample_cuda test_mask_cuda test_moe_cuda test_exec_cuda test_gpu_kv_alloc test_fork_cuda test_threads test_gdn_cuda test_hybrid test_kquant_cuda \
    compare_logits bench_attend_cuda bench_gemv_cuda bench_narrow_cuda bench_kquant_cuda bench_moe_cuda bench_threads bench_grammar
rm -rf "$OUT"
mkdir -p "$OUT/tests" "$OUT/bench" "$OUT/lib"
install -s "$TREE/offgraph" "$OUT/offgraph"
for t in test_ops_cuda test_attend_cuda test_sample_cuda test_mask_cuda test_moe_cuda test_exec_cuda test_gpu_kv_alloc test_fork_cuda test_threads test_gdn_cuda test_hybrid test_kquant_cuda compare_logits; do install -s "$TREE/tests/$t" "$OUT/tests/$t"; done
for b in bench_attend_cuda bench_gemv_cuda bench_narrow_cuda bench_kquant_cuda bench_moe_cuda bench_threads bench_grammar; do install -s "$TREE/bench/$b" "$OUT/bench/$b"; done
# libraries resolved outside the CUDA toolkit and the C/C++ runtime
for bin in "$OUT"/offgraph "$OUT"/tests/* "$OUT"/bench/*; do
    ldd "$bin" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
    case $name in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libgcc_s.so* | libstdc++.so*) ;;
    libcuda.so* | libcudart.so* | libcublas*.so*) ;;
    *) cp -L "$path" "$OUT/lib/$name" ;;
    esac
done
du -sh "$OUT"
ls "$OUT/lib"
mkdir -p "$SRC/build-pack"
# one dictionary over the whole folder: every test carries the same kernels,
# which xz then stores once (a third of the size at xz's default dictionary)
tar -C "$(dirname "$OUT")" -cf - "$(basename "$OUT")" | xz -T2 -9 --lzma2=preset=9,dict=256MiB >"$SRC/build-pack/$(basename "$OUT").txz"
ls -l "$SRC/build-pack/$(basename "$OUT").txz"
