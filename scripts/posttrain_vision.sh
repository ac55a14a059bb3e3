#!/usr/bin/env bash
# RL on images (docs/post-training.md, "RL on images"): the vision demo's model (docs/vision.md,
# rendered "a+b" read at 26.9 % from raw " sum? " prompts) post-trained on the same rendered
# problems in the XTML chat format, its encoder frozen:
#   0. the vision model itself evaluated in the chat format (it never saw XTML turns);
#   1. a short SFT stage on image problems in chat turns at effort low (answer only), so the
#      reply has the format the verifier checks (`k3cpp sft`, "task": "image_arithmetic");
#   2. RL with verifiable rewards on image prompts (`k3cpp rl`, DAPO, G samples per prompt, KL to
#      the SFT model), training problems from the "train" split of operand pairs;
#   3. the SFT and RL models on held-out problems (the "heldout" split, eval seed EVAL_SEED, not
#      used for any setting), EVAL_K samples each at temperature 1, the same draws for both;
#   4. report.json / report.md (pass@1 and pass@k with paired standard errors, by carry, the
#      reward curve, response lengths) and curves.svg.
#
# usage: scripts/posttrain_vision.sh OUT_DIR vision|vision-tiny
#   VISION_CHECKPOINT=DIR  the vision model (default /work/vision-more/checkpoint; read only)
#   vision-tiny            seconds, on the tiny released-layout fixture's random encoder
#   SFT_CHECKPOINT=DIR     skip stage 1 and start RL from DIR (an earlier run's sft/checkpoint)
# Every setting can be overridden from the environment (SFT_STEPS, RL_STEPS, LR, KL, ...).
set -euo pipefail
OUT=${1:?usage: posttrain_vision.sh OUT_DIR vision|vision-tiny}
SCALE=${2:-vision}
HERE=$(cd "$(dirname "$0")/.." && pwd)
K3CPP=${K3CPP:-$HERE/build/k3cpp}
THREADS=${THREADS:-2}
case "$SCALE" in
  vision)      D_VIS=/work/vision-more/checkpoint; D_SFT_STEPS=150; D_SFT_BATCH=16; D_SFT_LR=1e-3; D_SFT_PROBLEMS=4000
               D_RL_STEPS=100; D_PROMPTS=8; D_G=8; D_LR=2e-4; D_EVAL=200; D_K=8; D_BUDGET=40; D_VIS_EVAL=32 ;;
  vision-tiny) D_VIS=$HERE/tests/data/k3-release-tiny; D_SFT_STEPS=2; D_SFT_BATCH=2; D_SFT_LR=1e-3; D_SFT_PROBLEMS=20
               D_RL_STEPS=2; D_PROMPTS=2; D_G=2; D_LR=1e-3; D_EVAL=2; D_K=2; D_BUDGET=4; D_VIS_EVAL=1 ;;
  *) echo "posttrain_vision.sh: scale must be vision or vision-tiny, got '$SCALE'" >&2; exit 2 ;;
esac
VIS=${VISION_CHECKPOINT:-$D_VIS}
[ -f "$VIS/config.json" ] || { echo "posttrain_vision.sh: $VIS is not a model directory (no config.json)" >&2; exit 2; }
[ -f "$VIS/vision.safetensors" ] || [ "$SCALE" = vision-tiny ] ||
  { echo "posttrain_vision.sh: $VIS has no vision.safetensors (not a vision model)" >&2; exit 2; }
SFT_PROBLEMS=${SFT_PROBLEMS:-$D_SFT_PROBLEMS}; SFT_STEPS=${SFT_STEPS:-$D_SFT_STEPS}; SFT_BATCH=${SFT_BATCH:-$D_SFT_BATCH}; SFT_LR=${SFT_LR:-$D_SFT_LR}
RL_STEPS=${RL_STEPS:-$D_RL_STEPS}; RL_PROMPTS=${RL_PROMPTS:-$D_PROMPTS}; G=${G:-$D_G}; LR=${LR:-$D_LR}
KL=${KL:-0.05}; EVAL_PROBLEMS=${EVAL_PROBLEMS:-$D_EVAL}; EVAL_K=${EVAL_K:-$D_K}; BUDGET=${BUDGET:-$D_BUDGET}
VIS_EVAL=${VIS_EVAL:-$D_VIS_EVAL}
EVAL_SEED=${EVAL_SEED:-4243}  # held-out problems no setting was chosen on (tuning used 977)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VIS=$(cd "$VIS" && pwd)

t() { date +%s.%N; }
elapsed() { python3 -c "print(round($2 - $1, 1))"; }
T0=$(t)

# 1. SFT on image problems in chat turns (effort low: the answer only, as the vision data's).
cat > "$OUT/sft.json" <<JSON
{"model": "$VIS", "task": "image_arithmetic",
 "arithmetic": {"efforts": ["low"], "problems": $SFT_PROBLEMS, "seed": 11},
 "steps": $SFT_STEPS, "batch": $SFT_BATCH, "lr": $SFT_LR, "lr_end": $(python3 -c "print($SFT_LR/10)"), "warmup_steps": 5,
 "optimizer": "adamw", "threads": $THREADS, "checkpoint_every": 1000, "seed": 3}
JSON
if [ -n "${SFT_CHECKPOINT:-}" ]; then  # reuse an SFT model made by this stage (its sft.json beside it)
  SFT=$(cd "$SFT_CHECKPOINT" && pwd)
else
  rm -rf "$OUT/sft"
  "$K3CPP" sft --config "$OUT/sft.json" --out "$OUT/sft" --quiet > /dev/null
  SFT="$OUT/sft/checkpoint"
fi
T1=$(t)

# 2. RL on image prompts.
cat > "$OUT/rl.json" <<JSON
{"model": "$SFT", "task": "image_arithmetic",
 "arithmetic": {"efforts": ["low"], "problems": 100000, "seed": 21},
 "eval": {"efforts": ["low"], "problems": $EVAL_PROBLEMS, "seed": $EVAL_SEED},
 "eval_every": 0, "eval_samples": $EVAL_K,
 "steps": $RL_STEPS, "prompts_per_step": $RL_PROMPTS, "group_size": $G,
 "budgets": {"low": $BUDGET, "high": $BUDGET, "max": $BUDGET},
 "lambda": 1.0, "loss": "dapo", "kl_coef": $KL, "lr": $LR, "warmup_steps": 5,
 "optimizer": "adamw", "threads": $THREADS, "checkpoint_every": 50, "seed": 5}
JSON
rm -rf "$OUT/rl"
"$K3CPP" rl --config "$OUT/rl.json" --out "$OUT/rl" --quiet > /dev/null
T2=$(t)

# 3. Held-out problems: the SFT and RL models (the same problems and draws), and a check of the
# vision model as it is on the first VIS_EVAL of them x 2 samples (it never saw chat turns).
sed "s/\"problems\": $EVAL_PROBLEMS,/\"problems\": $VIS_EVAL,/" "$OUT/rl.json" > "$OUT/rl-vision-check.json"
"$K3CPP" rl --config "$OUT/rl-vision-check.json" --eval "$VIS" --samples 2 > "$OUT/eval-vision.json" 2>/dev/null
"$K3CPP" rl --config "$OUT/rl.json" --eval "$SFT" > "$OUT/eval-sft.json" 2>/dev/null
"$K3CPP" rl --config "$OUT/rl.json" --eval "$OUT/rl/checkpoint" > "$OUT/eval-rl.json" 2>/dev/null
T3=$(t)

# 4. Report.
python3 "$HERE/tools/plot_posttrain.py" "$OUT/curves.svg" "$OUT/rl/metrics.jsonl"
python3 "$HERE/tools/posttrain_vision_report.py" "$OUT" "$(elapsed $T0 $T1)" "$(elapsed $T1 $T2)" \
  "$(elapsed $T2 $T3)" > "$OUT/report.md"
cat "$OUT/report.md"
echo "posttrain_vision ($SCALE): $(elapsed $T0 $(t)) s; report $OUT/report.json, $OUT/report.md, curves $OUT/curves.svg"
