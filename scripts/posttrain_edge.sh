#!/usr/bin/env bash
# The edge-of-competence RL run of the post-training demonstration (docs/post-training.md,
# "The edge run"): from an SFT model, RL with a curriculum restricted to the band where the
# SFT model is at the edge of its competence (docs/model.md section 12: RL helps there), then
# the SFT and RL models evaluated on that band with enough problems for a standard error near
# 0.05 (the same problems and the same draws for both models: a paired comparison), a check
# that a low-effort tool answer fits its budget, report.json, report.md and curves.svg.
#
# usage: scripts/posttrain_edge.sh OUT_DIR edge|edge-tiny SFT_CHECKPOINT_DIR
#   (normally through scripts/posttrain_demo.sh OUT_DIR edge, which pretrains and fine-tunes
#   first when SFT_CHECKPOINT is not set)
# RL runs in chunks of CHUNK steps (each a `k3cpp rl --resume`, exact: the checkpoint holds
# the optimiser and the partial rollouts) until RL_SECONDS of wall time or RL_MAX_STEPS steps,
# whichever comes first, so the run fits its time slot whatever the machine's speed.
# Every setting below can be overridden from the environment (BANDS='"2+", "3+"' ...).
set -euo pipefail
OUT=${1:?usage: posttrain_edge.sh OUT_DIR edge|edge-tiny SFT_CHECKPOINT_DIR}
SCALE=${2:?usage: posttrain_edge.sh OUT_DIR edge|edge-tiny SFT_CHECKPOINT_DIR}
SFT=${3:?usage: posttrain_edge.sh OUT_DIR edge|edge-tiny SFT_CHECKPOINT_DIR}
HERE=$(cd "$(dirname "$0")/.." && pwd)
K3CPP=${K3CPP:-$HERE/build/k3cpp}
THREADS=${THREADS:-2}
[ -f "$SFT/config.json" ] || { echo "posttrain_edge.sh: $SFT is not a model directory (no config.json)" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SFT=$(cd "$SFT" && pwd)

# Defaults chosen from measurements of the full run's SFT model (docs/post-training.md, "The
# edge run"): 3-digit addition at effort high / max has pass@1 0.375 / 0.594 (16 problems x 4
# samples each), so most groups of 8 have reward variance (68-74 % kept); low effort (no
# trace) is near 0 on it and 2-digit multiplication is at 0.0-0.03 (groups dropped: no
# signal), so neither is trained. lr: 1e-3 collapsed the policy within 4 steps (share correct
# 0.56 -> 0.06), 1e-4 moved held-out pass@1 by +0.016 in 20 steps, 3e-4 by +0.19 +- 0.06 in
# 100 steps with the demo's high budget of 128 (but high effort then learnt max's 70-token
# trace) and by +0.09 +- 0.04 with high's budget at 56 (1.6 x its 35-token trace: both
# efforts gained and kept distinct lengths), hence high 56 here; 200 steps is twice the
# rehearsed length, about 12 min at the rehearsal's undisturbed 3-4 s per step (noisy), and
# RL_SECONDS caps it on a slower machine.
case "$SCALE" in
  edge)      D_G=8; D_PROMPTS=4; D_LR=3e-4; D_MAX=200; D_SECONDS=1320; D_CHUNK=10; D_PER_BAND=96; D_K=8
             D_BUDGETS='{"low": 48, "high": 56, "max": 320}'; D_TOOL_BUDGETS='{"low": 112, "high": 192, "max": 384}'
             D_CHECK_PER_BAND=4; D_CHECK_K=2 ;;
  edge-tiny) D_G=2; D_PROMPTS=2; D_LR=1e-3; D_MAX=4; D_SECONDS=120; D_CHUNK=2; D_PER_BAND=2; D_K=2
             D_BUDGETS='{"low": 6, "high": 12, "max": 16}'; D_TOOL_BUDGETS='{"low": 8, "high": 14, "max": 18}'
             D_CHECK_PER_BAND=1; D_CHECK_K=1 ;;
  *) echo "posttrain_edge.sh: scale must be edge or edge-tiny, got '$SCALE'" >&2; exit 2 ;;
esac
BANDS=${BANDS:-'"3+"'}; EFFORTS=${EFFORTS:-'"high", "max"'}
G=${G:-$D_G}; RL_PROMPTS=${RL_PROMPTS:-$D_PROMPTS}; LR=${LR:-$D_LR}; LR_END=${LR_END:-$LR}; LAMBDA=${LAMBDA:-1.0}
# KL to the SFT model: 0.05 kept the bands RL does not train (-0.02 pass@1 overall, against
# -0.10 without it) and the edge band's gain (+0.18 on fresh problems); 0.2 lost the gain.
KL=${KL:-0.05}
RL_MAX_STEPS=${RL_MAX_STEPS:-$D_MAX}; RL_SECONDS=${RL_SECONDS:-$D_SECONDS}; CHUNK=${CHUNK:-$D_CHUNK}
EVAL_PER_BAND=${EVAL_PER_BAND:-$D_PER_BAND}; EVAL_K=${EVAL_K:-$D_K}
BUDGETS=${BUDGETS:-$D_BUDGETS}; TOOL_BUDGETS=${TOOL_BUDGETS:-$D_TOOL_BUDGETS}

t() { date +%s.%N; }
elapsed() { python3 -c "print(round($2 - $1, 1))"; }
T0=$(t)

cat > "$OUT/rl.json" <<JSON
{"model": "$SFT",
 "arithmetic": {"bands": [$BANDS], "efforts": [$EFFORTS], "tool_share": 0.0, "problems": 100000, "seed": 21},
 "eval": {"bands": [$BANDS], "efforts": [$EFFORTS], "tool_share": 0.0, "problems_per_band": $EVAL_PER_BAND,
          "seed": 977},
 "eval_every": 0, "eval_samples": $EVAL_K,
 "steps": $RL_MAX_STEPS, "prompts_per_step": $RL_PROMPTS, "group_size": $G, "budgets": $BUDGETS,
 "tool_budgets": $TOOL_BUDGETS, "lambda": $LAMBDA, "loss": "dapo", "kl_coef": $KL, "lr": $LR, "lr_end": $LR_END, "warmup_steps": 5,
 "optimizer": "adamw", "threads": $THREADS, "checkpoint_every": $CHUNK, "seed": 5}
JSON
# The budget check: low-effort answers with the calculator on four bands, under tool_budgets
# and, for contrast, under the plain budgets (what every earlier run used).
tool_check() {  # $1 file, $2 tool budgets JSON or empty
local tb=""
[ -n "$2" ] && tb=", \"tool_budgets\": $2"
cat > "$1" <<JSON
{"model": "$SFT", "arithmetic": {"bands": ["1+"]},
 "eval": {"bands": ["1+", "2+", "2*", "3*"], "efforts": ["low"], "tool_share": 1.0,
          "problems_per_band": $D_CHECK_PER_BAND, "seed": 978},
 "eval_samples": $D_CHECK_K, "budgets": $BUDGETS$tb}
JSON
}
tool_check "$OUT/tool-check.json" "$TOOL_BUDGETS"
tool_check "$OUT/tool-check-plain.json" ""
"$K3CPP" rl --config "$OUT/tool-check.json" --eval "$SFT" > "$OUT/eval-toolcheck-budgets.json" 2>/dev/null
"$K3CPP" rl --config "$OUT/tool-check-plain.json" --eval "$SFT" > "$OUT/eval-toolcheck-plain.json" 2>/dev/null
T1=$(t)

# RL in chunks until the time or step limit.
steps_done() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['state']['step'])" "$OUT/rl/checkpoint/posttrain_state.json"; }
rm -rf "$OUT/rl"
"$K3CPP" rl --config "$OUT/rl.json" --out "$OUT/rl" --steps "$CHUNK" --quiet > /dev/null
DONE=$(steps_done)
while [ "$DONE" -lt "$RL_MAX_STEPS" ]; do
  NOW=$(t)
  # Stop when another chunk at the mean pace so far would overrun RL_SECONDS.
  if python3 -c "import sys; e=$NOW-$T1; sys.exit(0 if e + e/$DONE*$CHUNK > $RL_SECONDS else 1)"; then break; fi
  "$K3CPP" rl --config "$OUT/rl.json" --out "$OUT/rl" --resume --steps $((DONE + CHUNK)) --quiet > /dev/null
  DONE=$(steps_done)
done
T2=$(t)
echo "posttrain_edge: $DONE RL steps in $(elapsed $T1 $T2) s"

# SFT vs RL on the edge band: the same problems, the same draws.
"$K3CPP" rl --config "$OUT/rl.json" --eval "$SFT" --tool-share 0 > "$OUT/eval-edge-sft.json" 2>/dev/null
"$K3CPP" rl --config "$OUT/rl.json" --eval "$OUT/rl/checkpoint" --tool-share 0 > "$OUT/eval-edge-rl.json" 2>/dev/null
T3=$(t)
python3 "$HERE/tools/plot_posttrain.py" "$OUT/curves.svg" "$OUT/rl/metrics.jsonl"
python3 "$HERE/tools/plot_posttrain.py" --edge "$OUT/report.json" "$OUT" \
  "$(elapsed $T0 $T1)" "$(elapsed $T1 $T2)" "$(elapsed $T2 $T3)" > "$OUT/report.md"
cat "$OUT/report.md"
echo "posttrain_edge ($SCALE): $(elapsed $T0 $(t)) s; report $OUT/report.json, $OUT/report.md, curves $OUT/curves.svg"
