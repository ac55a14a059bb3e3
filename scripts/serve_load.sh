#!/usr/bin/env bash
# Load test of `k3cpp serve` (not part of ctest): a few hundred streaming chat requests at
# concurrency 1, 4 and 16 against a loopback server that tools/serve_check/load.mjs starts and
# stops itself; prints requests/s, generated tokens/s, p50/p99 TTFT and inter-token latency,
# failed requests and the server's RSS before/after (docs/serving.md has a run).
#   bash scripts/serve_load.sh [model dir | demo] [load.mjs options: --requests N --levels 1,4,16 --server-args "..."]
# The default model is the tiny fixture (tests/data/k3-release-tiny); `demo` writes a random
# model of the demo training shape (configs/small-896.json: d 128, 8 layers, 896 experts, 40.6 M
# parameters, MXFP4 experts) with the fixture's K3-layout tiktoken vocabulary into the build
# directory (k3cpp init, seed 1) and serves that.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-$ROOT/tests/data/k3-release-tiny}"
shift || true
BUILD="${BUILD:-$ROOT/build}"
if [ ! -x "$BUILD/k3cpp" ]; then
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DK3_BUILD_BENCH=OFF >/dev/null
  nice cmake --build "$BUILD" -j2 --target k3cpp
fi
[ -d "$ROOT/tools/serve_check/node_modules" ] || bash "$ROOT/scripts/setup.sh"
if [ "$MODEL" = "demo" ]; then
  MODEL="$BUILD/serve-load-demo"
  if [ ! -f "$MODEL/model.safetensors" ]; then
    node -e 'const fs=require("fs"); const c=JSON.parse(fs.readFileSync(process.argv[1])); (c.text_config||c).vocab_size=544;
             fs.writeFileSync(process.argv[2], JSON.stringify(c, null, 1))' "$ROOT/configs/small-896.json" "$BUILD/serve-load-demo.json"
    "$BUILD/k3cpp" init "$BUILD/serve-load-demo.json" "$MODEL" --seed 1 --experts mxfp4 --dtype bf16 --force
    cp "$ROOT/tests/data/k3-release-tiny/tiktoken.model" "$ROOT/tests/data/k3-release-tiny/tokenizer_config.json" "$MODEL/"
  fi
fi
echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores"
node "$ROOT/tools/serve_check/load.mjs" "$BUILD/k3cpp" "$MODEL" "$@"
