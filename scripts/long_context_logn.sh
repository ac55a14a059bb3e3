#!/usr/bin/env bash
# Study 4 of docs/long-context.md (issue 16): trains a long-context recipe at run seed SEED
# (default study 2's 2x recipe) and scores its final model on passkey at 16x the training
# length (4096 tokens, 5 depths x 16 samples = 80 prompts, evaluation seed 0) plainly and with
# log-length attention scaling at each base of BASES (`eval --attn-logn N`; 0 is the plain
# K3 forward). A finished training or evaluation is not redone. Writes OUT/{run.json,train,
# train.log,passkey16x-logn<N>.json,summary.txt}. About 40 min per seed at one thread on the
# 2-core machine shared with other work (2,400-3,600 s measured for four runs side by side).
# usage: [CONFIG=run.json] [K3CPP=bin] scripts/long_context_logn.sh OUT SEED [THREADS] [BASES]
#   e.g. for s in 1 2 3 4; do bash scripts/long_context_logn.sh runs/long-study-4/2x-seed$s $s 1 & done
#   study 5 (another recipe, plain forward only, two threads; about 4.5 min a seed idle on a Zen 5):
#   for s in 1 2 3 4; do CONFIG=configs/study-long/hybrid-tasks-2x-early.json \
#     bash scripts/long_context_logn.sh runs/long-study-5/early-seed$s $s 2 0; done
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 OUT SEED [THREADS] [BASES]" >&2; exit 2; }
out=$1 seed=$2 threads=${3:-1} bases=${4:-0 1024 256 128 64}
config=${CONFIG:-configs/study-long/hybrid-tasks-2x.json}
bin=${K3CPP:-build/k3cpp}
[ -x "$bin" ] || bash scripts/build.sh
[ -f "$config" ] || { echo "$config: no such run file" >&2; exit 2; }
mkdir -p "$out"
# The run file with this seed and its model path made absolute (it is read from OUT).
python3 tools/run_file_with_seed.py "$config" "$out/run.json" "$seed"
start=$(date +%s)
if ! grep -q '"type":"end"' "$out/train/metrics.jsonl" 2>/dev/null; then
  resume=()
  [ -d "$out/train/checkpoint" ] && resume=(--resume)
  "$bin" train --config "$out/run.json" --out "$out/train" "${resume[@]}" --threads "$threads" --quiet > "$out/train.log"
fi
echo "trained in $(( $(date +%s) - start )) s"
for n in $bases; do
  j="$out/passkey16x-logn$n.json"
  [ -f "$j" ] || { "$bin" eval "$out/train/checkpoint" --task passkey --lengths 4096 --depths 0,0.25,0.5,0.75,1 \
    --samples 16 --seed 0 --threads "$threads" --attn-logn "$n" --json "$j.tmp" > /dev/null && mv "$j.tmp" "$j"; }
done
python3 - "$out" $bases <<'PY' | tee "$out/summary.txt"
import json, sys
out, bases = sys.argv[1], sys.argv[2:]
for n in bases:
    acc = [row[0] for row in json.load(open(f"{out}/passkey16x-logn{n}.json"))["accuracy"]]
    name = "plain" if n == "0" else f"--attn-logn {n}"
    print(f"{name:>18}: passkey 16x {sum(acc) / len(acc):.3f}  by depth " + " / ".join(f"{a:.2f}" for a in acc))
PY
