#!/usr/bin/env bash
# The main job: set up, build, then plan the released Kimi K3 (parameters, memory, FLOPs,
# placement on 8 x 80 GiB GPUs). A later issue replaces this with the training demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/k3cpp plan configs/kimi-k3.json --storage mxfp4 --context 131072 --gpus 64 --gpu-mem 141
