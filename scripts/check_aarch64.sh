#!/usr/bin/env bash
# Compiles the core and kernel layers for aarch64 (Highway's NEON target plus the scalar
# baseline) with Debian's cross compiler (g++-aarch64-linux-gnu, installed by setup.sh): the
# SIMD code must build for Arm even though nothing here can run it. Used by ctest
# (tests/CMakeLists.txt: aarch64_kernels_compile). Objects go to a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${AARCH64_CXX:-aarch64-linux-gnu-g++}
command -v "$CXX" >/dev/null || { echo "check_aarch64: $CXX not found (run scripts/setup.sh)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
defs='-DHWY_DISABLED_TARGETS=(HWY_SSSE3|HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128)'
n=0
for f in src/core/*.cpp src/kernels/*.cpp; do
  # cblas.h is the same header on every architecture; the x86 copy stands in for arm64's.
  "$CXX" -std=c++20 -O1 -fopenmp "$defs" -Isrc -I/usr/include/x86_64-linux-gnu/openblas-openmp \
    -c "$f" -o "$out/$(basename "$f").o"
  n=$((n + 1))
done
targets=$(aarch64-linux-gnu-nm -C "$out"/gemv.cpp.o | grep -o 'k3::N_[A-Z0-9_]*::RowsRange(' | sort -u | tr '\n' ' ')
echo "check_aarch64: $n files compiled for aarch64; gemv targets: $targets"
echo "$targets" | grep -q N_NEON || { echo "check_aarch64: no NEON code generated" >&2; exit 1; }
