#!/usr/bin/env bash
# Installs every Debian package k3cpp needs; a no-op when all are present.
# Used by the README's two commands and by .ci/run.
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config
  libopenblas-openmp-dev      # BLAS (OpenMP build, so BLAS and our loops share one thread pool)
  nlohmann-json3-dev          # JSON: configs, safetensors headers, fixtures
  libhwy-dev                  # Google Highway: SIMD kernels for every x86-64 / Arm target, run-time dispatch
  g++-aarch64-linux-gnu       # the kernels are compiled for aarch64 (NEON) by a test
  libgtest-dev libgmock-dev   # tests
  libbenchmark-dev            # benchmarks
  bible-kjv                   # default training corpus (`bible` prints the KJV text)
  python3-torch python3-numpy # independent PyTorch implementation in tools/ (tests, benchmarks)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
