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
  libpcre2-dev                # tokenizer pre-tokenizer regex (PCRE2 with JIT)
  nodejs                      # tokenizer oracle: the npm package tiktoken (tools/oracle)
  python3-torch python3-numpy # independent PyTorch implementation in tools/ (tests, benchmarks)
  libcpp-httplib-dev          # HTTP server of `k3cpp serve` (src/serve)
  chromium                    # the serve chat page checked in a real (headless) browser (tools/serve_check)
  libopenmpi-dev openmpi-bin  # MPI: data / expert parallelism (src/dist), its tests run under mpirun
  libpng-dev                  # PNG images for the vision encoder (src/io/image.*, --image)
  dataset-fashion-mnist       # vision training data: Fashion-MNIST idx files (docs/vision.md)
  unifont                     # unifont.hex bitmap glyphs: rendered digits, letters and arithmetic
  patchelf                    # the relocatable GPU bundle (scripts/gpu_bundle.sh): $ORIGIN runpaths
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm comes with some nodejs builds (NodeSource's) and is a separate Debian package otherwise.
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: installing npm"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
fi

# The tokenizer oracle's npm packages, pinned by tools/oracle/package-lock.json; skipped when
# node_modules already holds the pinned tiktoken.
ORACLE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/oracle"
want=$(node -e 'console.log(require(process.argv[1]).packages["node_modules/tiktoken"].version)' "$ORACLE/package-lock.json")
have=$(node -e 'try{console.log(require(process.argv[1]).version)}catch(e){console.log("none")}' "$ORACLE/node_modules/tiktoken/package.json")
if [ "$want" = "$have" ]; then
  echo "setup: npm tiktoken $have present"
else
  echo "setup: npm ci in tools/oracle (tiktoken $want)"
  (cd "$ORACLE" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The serve checks' npm packages (the openai client, puppeteer-core), pinned by
# tools/serve_check/package-lock.json; skipped when node_modules already holds both pinned versions.
CHECK="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/serve_check"
pinned() {  # "<openai version> <puppeteer-core version>" from a lock file or from node_modules
  node -e '
    const [dir, lock] = process.argv.slice(1);
    const v = (p) => { try { return lock === "lock" ? require(dir + "/package-lock.json").packages["node_modules/" + p].version
                                                  : require(dir + "/node_modules/" + p + "/package.json").version; }
                       catch (e) { return "none"; } };
    console.log(v("openai") + " " + v("puppeteer-core"));' "$CHECK" "$1"
}
want=$(pinned lock)
have=$(pinned modules)
if [ "$want" = "$have" ]; then
  echo "setup: npm openai + puppeteer-core $have present"
else
  echo "setup: npm ci in tools/serve_check (openai + puppeteer-core $want)"
  (cd "$CHECK" && npm ci --no-audit --no-fund --loglevel=error)
fi
