#!/usr/bin/env bash
# Builds k3cpp with its CUDA backend and gathers a relocatable bundle in ./gpu-bundle (ignored by
# git; and gpu-bundle.tar.xz, the same compressed): the k3cpp binary, libk3cuda.so, the CUDA tests, the op harness and the GPU benchmarks,
# with every shared library they need that a machine with only the NVIDIA driver, CUDA 13 and
# NCCL lacks (OpenBLAS, Highway, PCRE2, libpng, OpenMPI, cpp-httplib, libgomp, ...), each found
# through $ORIGIN. The machine's own CUDA runtime, cuBLAS and NCCL are used (cuBLAS alone is
# 580 MB); scripts/gpu_check.sh finds them. This is also how a user ships k3cpp to a GPU node:
#   bash scripts/gpu_bundle.sh && rsync -a gpu-bundle/ node:k3cpp/
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
grep -q "K3_CUDA:BOOL=ON" build/CMakeCache.txt || { echo "gpu_bundle: this build has no CUDA backend (nvcc not found)" >&2; exit 1; }
targets=(k3cpp k3cuda test_cuda test_ops bench_ops bench_gpu_model)
[ -f bench/cuda_kda.cpp ] && targets+=(bench_cuda_kda)
cmake --build build -j"$(nproc)" --target "${targets[@]}"

OUT=gpu-bundle
rm -rf "$OUT"
mkdir -p "$OUT"
bins=(build/k3cpp build/libk3cuda.so build/tests/test_cuda build/tests/test_ops build/bench/bench_ops
      build/bench/bench_gpu_model)
[ -f build/bench/bench_cuda_kda ] && bins+=(build/bench/bench_cuda_kda)
cp "${bins[@]}" "$OUT/"
# Libraries every Linux has (the C library and the compiler's runtime), and those the GPU
# machine brings itself (the driver, the CUDA runtime and cuBLAS of its CUDA 13, NCCL).
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|ld-linux|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=>/ && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! $name =~ $skip ]]; then cp -L "$path" "$OUT/$name"; fi
done
for f in "$OUT"/*; do
  strip --strip-unneeded "$f" 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN' "$f"
done
# One compressed file beside the folder: what travels to a GPU machine (scripts/gpu_check.sh
# unpacks it), small enough to go with the repository's working tree.
tar -C "$OUT" -cJf gpu-bundle.tar.xz .
echo "gpu_bundle: $OUT: $(ls "$OUT" | wc -l) files, $(du -sm "$OUT" | cut -f1) MiB; gpu-bundle.tar.xz $(du -sm gpu-bundle.tar.xz | cut -f1) MiB"
