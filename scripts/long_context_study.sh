#!/usr/bin/env bash
# The long-context study of docs/long-context.md (issue 16): four small K3-shaped models at equal
# width, depth and tokens (configs/study-long: the 3:1 KDA/MLA hybrid, pure KDA and pure NoPE
# MLA, each trained at 128 then 256 tokens with generated long-range tasks (answer targets
# weighted 20x) in half of the first stage's sequences and three quarters of the last stage's,
# and the hybrid trained on text only), each evaluated zero-shot from 1x to 32x its training
# length: passkey, MQAR, the mixed task and loss by position. Writes
# OUT/<run>/{checkpoint,metrics.jsonl,eval/*.json}, OUT/study.md (tables) and OUT/study.svg.
# A run whose checkpoint is complete is not retrained. About 20 minutes on 2 idle cores
# (estimated from three runs trained idle: 142-192 s each, plus their evaluations).
# An evaluation whose JSON exists is not rerun. LC_LENGTHS (default 256,...,8K) and LC_TASKS
# (default "passkey mqar mixed loss-by-position") narrow the evaluation.
# usage: scripts/long_context_study.sh [OUT_DIR] [SAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/long-study} samples=${2:-8}
bin=build/k3cpp
[ -x "$bin" ] || bash scripts/build.sh
lengths=${LC_LENGTHS:-256,512,1K,2K,4K,8K}
tasks=${LC_TASKS:-passkey mqar mixed loss-by-position}
mkdir -p "$out"
start=$(date +%s)
for run in hybrid-tasks kda-tasks mla-tasks hybrid-text; do
  dir="$out/$run"
  if [ -f "$dir/done" ]; then
    echo "== $run: trained (delete $dir to retrain)"
  else
    echo "== $run: training"
    rm -rf "$dir"
    t0=$(date +%s)
    "$bin" train --config "configs/study-long/$run.json" --out "$dir"
    echo $(( $(date +%s) - t0 )) > "$dir/done"
  fi
  mkdir -p "$dir/eval"
  ck="$dir/checkpoint"
  for task in $tasks; do
    j="$dir/eval/$task.json"
    [ -f "$j" ] && { echo "== $run: $task evaluated (delete $j to redo)"; continue; }
    case $task in
      passkey) args=(--depths 0,0.5,1 --samples "$samples") ;;
      mqar) args=(--pairs 4 --queries 2 --samples "$samples") ;;
      mixed) args=(--pairs 4 --queries 2 --hops 2 --samples "$samples") ;;
      loss-by-position) args=(--bucket 256) ;;
      *) echo "unknown task '$task' in LC_TASKS" >&2; exit 2 ;;
    esac
    "$bin" eval "$ck" --task "$task" --lengths "$lengths" "${args[@]}" --json "$j.tmp" && mv "$j.tmp" "$j"
  done
done
python3 tools/long_context_study.py "$out" hybrid-tasks kda-tasks mla-tasks hybrid-text
echo "wrote $out/study.md and $out/study.svg in $(( $(date +%s) - start )) s"
