#!/usr/bin/env bash
# The main job: set up, build, then train the default K3-shaped model (configs/train-demo.json:
# hybrid 3:1 KDA/MLA, Block AttnRes, 896 experts top-16 in a d/2 latent, SiTU-GLU, Quantile
# Balancing) through four context stages on the King James Bible, in about 10 minutes on 2
# cores; it prints generated samples and the summary table (held-out bits per byte per stage
# against the corpus's unigram baseline, MaxVio per MoE layer, tokens/s). docs/training.md.
# runs/demo is this demo's own output directory (ignored by git): it is replaced each time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
rm -rf runs/demo
./build/k3cpp train --config configs/train-demo.json --out runs/demo
