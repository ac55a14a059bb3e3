#!/usr/bin/env bash
# Trains a long-context run in segments and keeps a copy of the model at each of STEPS (used by
# scripts/long_context_select.sh and scripts/long_context_average.sh; docs/long-context.md).
# Writes OUT/run.json (CONFIG with run seed SEED), OUT/train (the run: `--steps S`, then
# `--resume`, which continues bitwise as the run that never stopped) and OUT/snap-<S> (the
# model directory at step S: weights, config, vocabulary; written under a temporary name, then
# renamed). A snapshot already kept is not redone.
# usage: [K3CPP=bin] scripts/long_context_snapshots.sh CONFIG OUT SEED "STEPS" [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: $0 CONFIG OUT SEED \"STEPS\" [THREADS]" >&2; exit 2; }
config=$1 out=$2 seed=$3 steps=$4 threads=${5:-2}
bin=${K3CPP:-build/k3cpp}
[ -x "$bin" ] || bash scripts/build.sh
[ -f "$config" ] || { echo "$config: no such run file" >&2; exit 2; }
mkdir -p "$out"
# The run file with this seed and its model path made absolute (it is read from OUT).
python3 tools/run_file_with_seed.py "$config" "$out/run.json" "$seed"
resume=()
[ -d "$out/train/checkpoint" ] && resume=(--resume)
for s in $steps; do
  [ ! -d "$out/snap-$s" ] || continue
  "$bin" train --config "$out/run.json" --out "$out/train" "${resume[@]}" --steps "$s" --threads "$threads" --quiet \
    > "$out/train-$s.log"
  resume=(--resume)
  rm -rf "$out/snap-$s.tmp" && mkdir "$out/snap-$s.tmp"
  (cd "$out/train/checkpoint" && cp config.json model.safetensors run.json tiktoken.model tokenizer_config.json "../../snap-$s.tmp/")
  mv "$out/snap-$s.tmp" "$out/snap-$s"
done
