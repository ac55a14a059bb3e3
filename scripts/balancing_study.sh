#!/usr/bin/env bash
# The load-balancing study (docs/balancing.md): trains the same K3-shaped model (896 experts
# top-16, latent d/2, 4 layers) from the same seed and data with every balancer of
# configs/study/ (QB exact, QB histogram, sign update, auxiliary loss at two coefficients,
# none), in two variants (dense first layer / MoE first layer), evaluates each trained model
# on the whole held-out set (`k3cpp eval`), and writes the plots and tables into
# docs/balancing/ and the table block of docs/balancing.md.
#
# usage: scripts/balancing_study.sh [OUT]     (OUT: run directory, default runs/balancing)
# Environment: K3_BUILD_DIR (default build), STUDY_VARIANTS, STUDY_METHODS (space-separated
# subsets), STUDY_FORCE=1 (retrain runs that are already complete). A run whose
# <name>.eval.json exists is kept, so an interrupted study continues where it stopped.
# About 40 minutes on 2 cores (12 runs of 48 steps of 4096 tokens plus evaluation).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/balancing}
BUILD=${K3_BUILD_DIR:-build}
VARIANTS=${STUDY_VARIANTS:-"dense-first moe-first"}
METHODS=${STUDY_METHODS:-"qb-exact qb-hist sign aux-1e-2 aux-1e-1 none"}
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target k3cpp >/dev/null
K3="$BUILD/k3cpp"
mkdir -p "$OUT"

t0=$(date +%s)
for v in $VARIANTS; do
  for m in $METHODS; do
    name="$v-$m"
    run="configs/study/$name.json"
    [ -f "$run" ] || { echo "balancing_study: no run file $run" >&2; exit 1; }
    if [ -f "$OUT/$name.eval.json" ] && [ "${STUDY_FORCE:-0}" != 1 ]; then
      echo "[$(($(date +%s) - t0))s] $name: complete, kept"
      continue
    fi
    rm -rf "${OUT:?}/$name" "$OUT/$name.eval.json"
    echo "[$(($(date +%s) - t0))s] $name: training"
    "$K3" train --config "$run" --out "$OUT/$name" --quiet > "$OUT/$name.train.txt"
    echo "[$(($(date +%s) - t0))s] $name: held-out evaluation"
    # k3cpp eval exits non-zero if any routed slot was dropped.
    "$K3" eval "$OUT/$name/checkpoint" --json "$OUT/$name.eval.json.tmp" > "$OUT/$name.eval.txt"
    mv "$OUT/$name.eval.json.tmp" "$OUT/$name.eval.json"
    sed -n '/^ *layer/,$p' "$OUT/$name.eval.txt" | sed 's/^/    /'
  done
done
echo "[$(($(date +%s) - t0))s] plots and tables"
"$PY" tools/balancing_plots.py --runs "$OUT" --out docs/balancing --doc docs/balancing.md \
  --variants $VARIANTS --methods $METHODS
echo "balancing_study: done in $(($(date +%s) - t0)) s; runs in $OUT, plots in docs/balancing/"
