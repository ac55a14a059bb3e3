#!/usr/bin/env bash
# Long-context evaluation of one model (docs/long-context.md): passkey over a depth x length
# grid, MQAR, variable tracking and loss by position, each as JSON, and their SVG plots.
# usage: scripts/long_context_eval.sh MODEL_DIR OUT_DIR [LENGTHS] [SAMPLES]
#   LENGTHS default 1K,2K,4K,8K,16K; SAMPLES per grid cell, default 3.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 MODEL_DIR OUT_DIR [LENGTHS] [SAMPLES]" >&2; exit 2; }
model=$1 out=$2 lengths=${3:-1K,2K,4K,8K,16K} samples=${4:-3}
bin=build/k3cpp
[ -x "$bin" ] || bash scripts/build.sh
mkdir -p "$out"
start=$(date +%s)
for task in passkey vartrack mqar; do
  echo "== $task"
  "$bin" eval "$model" --task "$task" --lengths "$lengths" --samples "$samples" --json "$out/$task.json"
done
echo "== loss-by-position"
"$bin" eval "$model" --task loss-by-position --lengths "$lengths" --json "$out/loss-by-position.json" || \
  echo "(loss-by-position skipped: the held-out text is shorter than the longest length)"
python3 tools/plot_long_context.py "$out/long-context.svg" "$out"/*.json
echo "wrote $out/*.json and $out/long-context.svg in $(( $(date +%s) - start )) s"
