#!/usr/bin/env bash
# The load-balancing study (docs/balancing.md): trains the same K3-shaped model (896 experts
# top-16, latent d/2, 4 layers) from the same seed and data with every balancer of
# configs/study/ (QB exact, QB histogram, sign update, auxiliary loss at two coefficients,
# none), in two variants (dense first layer / MoE first layer), plus two stronger settings on
# the MoE-first variant (sign update u = 1e-2, auxiliary loss alpha = 1), evaluates each model
# on the whole held-out set (`k3cpp eval`, windows of the trained 256 tokens, and of 1024 for
# the sequence-level figures, both with the Moving QB selection beside the static one), and
# writes the plots and tables into docs/balancing/ and the table block of docs/balancing.md.
#
# usage: scripts/balancing_study.sh [OUT]     (OUT: run directory, default runs/balancing)
# Environment: K3_BUILD_DIR (default build), K3_NO_BUILD=1 (use the k3cpp already built there),
# STUDY_VARIANTS, STUDY_METHODS (space-separated subsets), STUDY_EXTRA (extra run names,
# default the two stronger settings; "" for none), STUDY_FORCE=1 (redo everything).
# Finished steps are kept (a trained run: its metrics.jsonl has the "end" record; an
# evaluation: its JSON exists), so an interrupted study continues where it stopped.
# 14 runs of 48 steps of 4096 tokens, each evaluated twice: 22 minutes on the 2-core machine
# when it was otherwise idle, about 45 when other jobs took half of it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/balancing}
BUILD=${K3_BUILD_DIR:-build}
VARIANTS=${STUDY_VARIANTS:-"dense-first moe-first"}
METHODS=${STUDY_METHODS:-"qb-exact qb-hist sign aux-1e-2 aux-1e-1 none"}
EXTRA=${STUDY_EXTRA-"moe-first-sign-1e-2 moe-first-aux-1"}
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3

if [ "${K3_NO_BUILD:-0}" != 1 ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target k3cpp >/dev/null
fi
K3="$BUILD/k3cpp"
[ -x "$K3" ] || { echo "balancing_study: no $K3 (build it or unset K3_NO_BUILD)" >&2; exit 1; }
mkdir -p "$OUT"
[ "${STUDY_FORCE:-0}" = 1 ] && rm -rf "${OUT:?}"/*

t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*"; }
# eval NAME SUFFIX SEQ_LEN: the held-out evaluation into OUT/NAME.SUFFIX.{json,txt}.
evaluate() {
  local json="$OUT/$1.$2.json"
  [ -f "$json" ] && return 0
  say "$1: held-out evaluation, windows of $3 tokens"
  # k3cpp eval exits non-zero if any routed slot was dropped.
  "$K3" eval "$OUT/$1/checkpoint" --seq-len "$3" --moving-qb --json "$json.tmp" > "$OUT/$1.$2.txt"
  mv "$json.tmp" "$json"
  sed -n '/^ *layer/,$p' "$OUT/$1.$2.txt" | sed 's/^/    /'
}

names=()
for v in $VARIANTS; do
  for m in $METHODS; do names+=("$v-$m"); done
done
for name in $EXTRA; do names+=("$name"); done
for name in "${names[@]}"; do
  run="configs/study/$name.json"
  [ -f "$run" ] || { echo "balancing_study: no run file $run" >&2; exit 1; }
  if ! grep -qs '"type":"end"' "$OUT/$name/metrics.jsonl"; then
    rm -rf "${OUT:?}/$name" "$OUT/$name".*
    say "$name: training"
    "$K3" train --config "$run" --out "$OUT/$name" --quiet > "$OUT/$name.train.txt"
  fi
  evaluate "$name" eval 256
  evaluate "$name" long 1024
done
say "plots and tables"
"$PY" tools/balancing_plots.py --runs "$OUT" --out docs/balancing --doc docs/balancing.md \
  --variants $VARIANTS --methods $METHODS sign-1e-2 aux-1
echo "balancing_study: done in $(($(date +%s) - t0)) s; runs in $OUT, plots in docs/balancing/"
