#!/usr/bin/env bash
# Study 7 of docs/long-context.md (issue 16): one run of a long-context recipe with its late
# snapshots averaged. Trains CONFIG with run seed SEED in segments, keeping the model at each
# step of STEPS (scripts/long_context_snapshots.sh: the run is bitwise the straight run), writes
# OUT/average, the equal-weight mean of those snapshots (`k3cpp average`), and evaluates the
# average and the final model (the last of STEPS) with the protocol: passkey at 16x (4096
# tokens, depths 0 / 0.25 / 0.5 / 0.75 / 1 x 16 samples = 80 prompts, evaluation seed 0), the
# held-out text loss (16384 tokens at 256, the trainer's held-out set) and MQAR from 1x to 32x
# (4 pairs, 2 asked, 8 samples per length). Writes OUT/{run.json,
# train,snap-<S>,average,eval-average,eval-final,summary.txt}; what exists is not redone.
# With LC_EACH=1 also every snapshot's passkey at 16x (tools/plot_snapshot_average.py plots them).
# About 7 min a run on the idle 2-core Zen 4 (5 min of training, 45 s per passkey evaluation).
# usage: [K3CPP=bin] scripts/long_context_average.sh CONFIG OUT SEED "STEPS" [THREADS]
#   e.g. study 7 (AVX3 kernels; K3_SIMD_TARGET=avx2 for the AVX2 rows):
#   for s in 1 2 3 4; do bash scripts/long_context_average.sh configs/study-long/hybrid-tasks-2x-mid.json \
#     runs/long-study-7/mid-seed$s $s "288 336 384 432 480" 2; done
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: $0 CONFIG OUT SEED \"STEPS\" [THREADS]" >&2; exit 2; }
config=$1 out=$2 seed=$3 steps=$4 threads=${5:-2}
bin=${K3CPP:-build/k3cpp}
[ -x "$bin" ] || bash scripts/build.sh
start=$(date +%s)
bash scripts/long_context_snapshots.sh "$config" "$out" "$seed" "$steps" "$threads"
echo "trained in $(( $(date +%s) - start )) s"
last=${steps##* }
snaps=()
for s in $steps; do snaps+=("$out/snap-$s"); done
[ -d "$out/average" ] || "$bin" average "${snaps[@]}" --out "$out/average"
# run_eval MODEL DIR NAME ARGS...: one evaluation, written under a temporary name first.
run_eval() { local model=$1 d=$2 j="$2/$3.json"; shift 3; mkdir -p "$d"; [ -f "$j" ] || { "$bin" eval "$model" \
  --threads "$threads" "$@" --json "$j.tmp" > /dev/null && mv "$j.tmp" "$j"; }; }
for w in average final; do
  model="$out/average"
  [ "$w" = average ] || model="$out/snap-$last"
  run_eval "$model" "$out/eval-$w" passkey-16x --task passkey --lengths 4096 --depths 0,0.25,0.5,0.75,1 --samples 16 --seed 0
  run_eval "$model" "$out/eval-$w" heldout --data bible --heldout-every 40 --seq-len 256 --max-tokens 16384
  run_eval "$model" "$out/eval-$w" mqar --task mqar --lengths 256,512,1K,2K,4K,8K --pairs 4 --queries 2 --samples 8
done
# LC_EACH=1: passkey at 16x for every kept snapshot too (the plot of the run's trajectory).
if [ -n "${LC_EACH:-}" ]; then
  for s in $steps; do
    [ "$s" = "$last" ] || run_eval "$out/snap-$s" "$out/eval-snap-$s" passkey-16x --task passkey --lengths 4096 \
      --depths 0,0.25,0.5,0.75,1 --samples 16 --seed 0
  done
fi
python3 - "$out" "$steps" <<'PY' | tee "$out/summary.txt"
import json, sys
out, steps = sys.argv[1], sys.argv[2]
for w in ("average", "final"):
    acc = [row[0] for row in json.load(open(f"{out}/eval-{w}/passkey-16x.json"))["accuracy"]]
    held = json.load(open(f"{out}/eval-{w}/heldout.json"))
    mq = json.load(open(f"{out}/eval-{w}/mqar.json"))["accuracy"]
    mqar = [sum(r[i] for r in mq) / len(mq) for i in range(len(mq[0]))]
    name = f"average of {steps.replace(' ', ', ')}" if w == "average" else f"final ({steps.split()[-1]})"
    print(f"{name:>34}: passkey 16x {sum(acc) / len(acc):.3f}  by depth " + " / ".join(f"{a:.2f}" for a in acc) +
          f"  held-out {held['bpb']:.3f} bits/byte  MQAR 1x-32x " + " / ".join(f"{m:.2f}" for m in mqar))
PY
