#!/usr/bin/env bash
# One run of a long-context recipe with checkpoint choice on a 16x validation set
# (docs/long-context.md, issue 16). Trains CONFIG with run seed SEED in segments (--steps,
# then --resume: bitwise the straight run), keeps a copy of the model at each step of STEPS,
# scores each copy on passkey at VAL_LEN tokens with the validation seed (VAL_SEED, default 7,
# 5 depths x VAL_SAMPLES: never the evaluation's seed 0), chooses the best (ties: the later
# step), then evaluates with the docs' protocol: passkey at 16x (4096 tokens, 5 depths x 16
# samples = 80 prompts, seed 0) for the chosen and the final model; for the chosen one also
# the held-out text loss (16384 tokens at 256, the trainer's eval_tokens), MQAR (4 pairs, 2
# asked, 8 samples) from 1x to 32x and loss by position, and (unless LC_QUICK is set) passkey
# at 8x and 32x. Writes OUT/{run.json,train,snap-<step>,val-<step>.json,chosen,eval-chosen,
# eval-final,summary.json}. A step already kept, or an evaluation already written, is not redone.
# usage: scripts/long_context_select.sh CONFIG OUT SEED "STEPS" [THREADS]
#   e.g. scripts/long_context_select.sh configs/study-long/hybrid-tasks-2x-lengths.json \
#          runs/long-study-3/lengths-seed1 1 "288 336 384 432 480" 2
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: $0 CONFIG OUT SEED \"STEPS\" [THREADS]" >&2; exit 2; }
config=$1 out=$2 seed=$3 steps=$4 threads=${5:-2}
val_len=${VAL_LEN:-4096} val_seed=${VAL_SEED:-7} val_samples=${VAL_SAMPLES:-8}
bin=${K3CPP:-build/k3cpp}
[ -x "$bin" ] || bash scripts/build.sh
[ -f "$config" ] || { echo "$config: no such run file" >&2; exit 2; }
[ "$val_seed" != 0 ] || { echo "VAL_SEED 0 is the evaluation's seed: choose another" >&2; exit 2; }
start=$(date +%s)
bash scripts/long_context_snapshots.sh "$config" "$out" "$seed" "$steps" "$threads"
for s in $steps; do
  j="$out/val-$s.json"
  [ -f "$j" ] || { "$bin" eval "$out/snap-$s" --task passkey --lengths "$val_len" --depths 0,0.25,0.5,0.75,1 \
    --samples "$val_samples" --seed "$val_seed" --threads "$threads" --json "$j.tmp" > /dev/null && mv "$j.tmp" "$j"; }
done
train_s=$(( $(date +%s) - start ))
last=${steps##* }
chosen=$(python3 - "$out" $steps <<'EOF'
import json, sys
out, steps = sys.argv[1], sys.argv[2:]
best = None
for s in steps:
    a = json.load(open(f"{out}/val-{s}.json"))["accuracy"]
    acc = sum(r[0] for r in a) / len(a)
    print(f"validation step {s}: {acc:.3f}", file=sys.stderr)
    if best is None or acc >= best[1]: best = (s, acc)
print(best[0])
EOF
)
echo "$chosen" > "$out/chosen"
# run_eval SNAPSHOT DIR NAME ARGS...: one evaluation, written under a temporary name first.
run_eval() { local snap=$1 d=$2 j="$2/$3.json"; shift 3; mkdir -p "$d"; [ -f "$j" ] || { "$bin" eval "$out/snap-$snap" \
  --threads "$threads" "$@" --json "$j.tmp" > /dev/null && mv "$j.tmp" "$j"; }; }
pk16=(--task passkey --lengths 4096 --depths 0,0.25,0.5,0.75,1 --samples 16)
run_eval "$chosen" "$out/eval-chosen" passkey-16x "${pk16[@]}"
run_eval "$last" "$out/eval-final" passkey-16x "${pk16[@]}"
run_eval "$chosen" "$out/eval-chosen" heldout --data bible --heldout-every 40 --seq-len 256 --max-tokens 16384
run_eval "$chosen" "$out/eval-chosen" mqar --task mqar --lengths 256,512,1K,2K,4K,8K --pairs 4 --queries 2 --samples 8
run_eval "$chosen" "$out/eval-chosen" loss-by-position --task loss-by-position --lengths 256,512,1K,2K,4K,8K --bucket 256
[ -n "${LC_QUICK:-}" ] || run_eval "$chosen" "$out/eval-chosen" passkey-8x-32x --task passkey --lengths 2048,8192 \
  --depths 0,0.25,0.5,0.75,1 --samples 16
python3 - "$out" "$chosen" "$last" "$train_s" <<'EOF'
import json, os, sys
out, chosen, last, train_s = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def mean(f):
    a = json.load(open(f))["accuracy"]
    return [sum(r[i] for r in a) / len(a) for i in range(len(a[0]))]
res = {"chosen_step": int(chosen), "final_step": int(last), "train_and_validation_seconds": train_s}
for w in ("chosen", "final"):
    d = f"{out}/eval-{w}"
    r = {"step": int(chosen if w == "chosen" else last), "passkey_16x": mean(f"{d}/passkey-16x.json")[0],
         "passkey_16x_by_depth": [x[0] for x in json.load(open(f"{d}/passkey-16x.json"))["accuracy"]]}
    if os.path.exists(f"{d}/heldout.json"): r["heldout"] = json.load(open(f"{d}/heldout.json"))
    if os.path.exists(f"{d}/passkey-8x-32x.json"):
        r["passkey_8x"], r["passkey_32x"] = mean(f"{d}/passkey-8x-32x.json")
    if os.path.exists(f"{d}/mqar.json"): r["mqar_1x_to_32x"] = mean(f"{d}/mqar.json")
    res[w] = r
res["validation"] = {s: sum(x[0] for x in json.load(open(f"{out}/val-{s}.json"))["accuracy"]) / 5
                     for s in sorted((f[4:-5] for f in os.listdir(out) if f.startswith("val-") and f.endswith(".json")), key=int)}
json.dump(res, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(res))
EOF
