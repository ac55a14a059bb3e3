#!/usr/bin/env bash
# The vision demo (docs/vision.md): trains configs/train-vision-demo.json (a K3-shaped text
# model and a MoonViT-V2 encoder, jointly from step 0, on the King James Bible plus Fashion-MNIST,
# rendered scenes and rendered arithmetic), evaluates each task with its blind baselines, trains
# the text-only control (configs/train-vision-demo-text-only.json: same text tokens and seeds),
# and prints the report (tools/vision_report.py). Measured on 2 idle cores (docs/vision.md): the
# joint run 540 s (training 460 s, evaluation of 12,000 test examples with blind baselines), the
# text-only control 84 s: about 11 minutes with the build.
#   bash scripts/vision_demo.sh [OUT]     (default OUT: /tmp/k3-vision-demo; replaced)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/k3-vision-demo}
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DK3_BUILD_BENCH=OFF >/dev/null
cmake --build build -j"$(nproc)" --target k3cpp >/dev/null
rm -rf "$OUT"
mkdir -p "$OUT"
start=$(date +%s)
./build/k3cpp train --config configs/train-vision-demo.json --out "$OUT/joint"
./build/k3cpp train --config configs/train-vision-demo-text-only.json --out "$OUT/text-only" --threads "$(nproc)"
/usr/bin/python3 tools/vision_report.py "$OUT/joint" "$OUT/text-only" | tee "$OUT/report.md"
echo "vision demo: $(( $(date +%s) - start )) s; the model with its encoder: $OUT/joint/checkpoint"
echo "try: ./build/k3cpp generate $OUT/joint/checkpoint --image IMAGE.png --prompt ' what is this? ' --max-tokens 8"
