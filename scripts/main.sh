#!/usr/bin/env bash
# The main job: set up, build, then train the default K3-shaped model (configs/train-demo.json:
# hybrid 3:1 KDA/MLA, Block AttnRes, 896 experts top-16 in a d/2 latent, SiTU-GLU, Quantile
# Balancing) through four context stages on the King James Bible, in about 11 minutes on 2
# cores. The run first learns its vocabulary from the training chapters (BPE in K3's tiktoken
# format, 2048 ids with K3's special and reserved ids; under a second) into
# runs/demo/tokenizer; it prints generated samples and the summary table (held-out bits per
# byte per stage against the corpus's unigram baseline, MaxVio per MoE layer, tokens/s).
# runs/demo/checkpoint is the trained model: k3cpp generate runs/demo/checkpoint --prompt ...
# docs/training.md. runs/demo is this demo's own output directory (ignored by git): it is
# replaced each time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
rm -rf runs/demo
./build/k3cpp train --config configs/train-demo.json --out runs/demo
