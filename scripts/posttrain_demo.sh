#!/usr/bin/env bash
# The post-training demonstration (docs/post-training.md): pretrain a small K3-shaped model on
# generated arithmetic with worked traces, SFT it on chat-formatted problems (three efforts,
# a quarter with the calculator tool), then RL with verifiable rewards; evaluate the SFT and
# RL models on held-out problems with and without the tool; plot the curves.
#
# usage: scripts/posttrain_demo.sh OUT_DIR [full|reduced|tiny|edge|edge-tiny|vision|vision-tiny]
#   full       the ~30 min target on 2 idle cores
#   reduced    fewer steps and problems (what fits a shared machine in ~20 min)
#   tiny       a seconds-long smoke run (ctest posttrain_demo_tiny): every stage, tiny sizes
#   edge       RL on the band at the edge of competence only (scripts/posttrain_edge.sh): reuses
#              SFT_CHECKPOINT=DIR when given (else pretrains and fine-tunes at `full` size
#              first), RL with the curriculum until RL_SECONDS, SFT vs RL on the edge band with
#              EVAL_PER_BAND problems x EVAL_K samples, report.json, report.md and curves.svg
#   edge-tiny  the same at tiny sizes (a rehearsal of the script, seconds)
#   vision     RL on the vision demo's rendered-arithmetic images (scripts/posttrain_vision.sh):
#              VISION_CHECKPOINT=DIR (default /work/vision-more/checkpoint), a short SFT stage on
#              image problems in chat turns, RL, SFT vs RL on held-out image problems
#   vision-tiny  the same at tiny sizes on the test fixture's random encoder (seconds)
# K3CPP (default build/k3cpp) is the binary. Every figure lands in OUT_DIR/report.json.
set -euo pipefail
OUT=${1:?usage: posttrain_demo.sh OUT_DIR [full|reduced|tiny|edge|edge-tiny|vision|vision-tiny]}
SCALE=${2:-full}
HERE=$(cd "$(dirname "$0")/.." && pwd)
K3CPP=${K3CPP:-$HERE/build/k3cpp}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
case "$SCALE" in
  vision|vision-tiny)
    exec env K3CPP="$K3CPP" THREADS="$THREADS" bash "$HERE/scripts/posttrain_vision.sh" "$OUT" "$SCALE" ;;
  edge|edge-tiny)
    if [ -z "${SFT_CHECKPOINT:-}" ]; then  # no model to reuse: pretrain + SFT first (stages 1-2 below)
      bash "$0" "$OUT/base" "$([ "$SCALE" = edge ] && echo full || echo tiny)" --base-only
      SFT_CHECKPOINT="$OUT/base/sft/checkpoint"
    fi
    exec env K3CPP="$K3CPP" THREADS="$THREADS" bash "$HERE/scripts/posttrain_edge.sh" "$OUT" "$SCALE" "$SFT_CHECKPOINT" ;;
esac
BASE_ONLY=${3:-}

case "$SCALE" in
  full)    PROBLEMS=40000; PRE_TOKENS=2400000; SFT_STEPS=300; SFT_PROBLEMS=6000; RL_STEPS=60; RL_PROMPTS=4; G=8
           EVAL_PROBLEMS=72; EVAL_K=8; PARTIAL_STEPS=6 ;;
  reduced) PROBLEMS=12000; PRE_TOKENS=600000; SFT_STEPS=160; SFT_PROBLEMS=3000; RL_STEPS=30; RL_PROMPTS=4; G=8
           EVAL_PROBLEMS=18; EVAL_K=8; PARTIAL_STEPS=4 ;;
  tiny)    PROBLEMS=300; PRE_TOKENS=8192; SFT_STEPS=2; SFT_PROBLEMS=20; RL_STEPS=2; RL_PROMPTS=2; G=2
           EVAL_PROBLEMS=2; EVAL_K=2; PARTIAL_STEPS=1 ;;
  *) echo "posttrain_demo.sh: scale must be full, reduced, tiny, edge or edge-tiny, got '$SCALE'" >&2; exit 2 ;;
esac
# Tool prompts get their own budgets: a calculator call and the answer turn after it take
# 64-69 tokens in the demo's vocabulary (run 2), over the low budget of 48 (rl.h tool_budgets).
if [ "$SCALE" = tiny ]; then BUDGETS='{"low": 6, "high": 12, "max": 16}'; TOOL_BUDGETS='{"low": 8, "high": 14, "max": 18}'
  SEQ=128; BATCH=1024
else BUDGETS='{"low": 48, "high": 128, "max": 320}'; TOOL_BUDGETS='{"low": 112, "high": 192, "max": 384}'
  SEQ=256; BATCH=4096; fi

t() { date +%s.%N; }
elapsed() { python3 -c "print(round($2 - $1, 1))"; }
T0=$(t)

# 1. Pretraining corpus and run (k3cpp train: trained BPE vocabulary, Muon, QB balancing).
"$K3CPP" arith-corpus --out "$OUT/corpus.txt" --problems $PROBLEMS --digits 1,2,3 --ops '+*' --seed 7
cat > "$OUT/pretrain.json" <<JSON
{"model": "$HERE/configs/train-tiny-model.json", "data": "$OUT/corpus.txt", "tokenizer": "train",
 "heldout_every": 40, "batch_tokens": $BATCH, "micro_batch_tokens": $((BATCH / 2)),
 "stages": [{"name": "arith", "seq_len": $SEQ, "tokens": $PRE_TOKENS, "lr_peak": 0.01, "lr_end": 0.001,
             "warmup_steps": 4, "decay_frac": 0.3}],
 "optimizer": "muon", "eval_every": 0, "eval_tokens": 8192, "checkpoint_every": 1000, "threads": $THREADS,
 "samples": ["47*85\n"], "sample_tokens": 60, "sample_temperature": 0}
JSON
T1=$(t)
"$K3CPP" train --config "$OUT/pretrain.json" --out "$OUT/pretrain" --quiet > "$OUT/pretrain.log"
T2=$(t)

# 2. SFT on chat-formatted problems: three efforts, a quarter with the calculator.
cat > "$OUT/sft.json" <<JSON
{"model": "$OUT/pretrain/checkpoint",
 "arithmetic": {"digits": [1, 2, 3], "ops": "+*", "efforts": ["low", "high", "max"], "tool_share": 0.25,
                "problems": $SFT_PROBLEMS, "seed": 11},
 "steps": $SFT_STEPS, "batch": 16, "lr": 2e-3, "lr_end": 2e-4, "warmup_steps": 10, "optimizer": "adamw",
 "threads": $THREADS, "checkpoint_every": 100, "max_tokens": 4096, "seed": 3}
JSON
"$K3CPP" sft --config "$OUT/sft.json" --out "$OUT/sft" --quiet
T3=$(t)
if [ "$BASE_ONLY" = --base-only ]; then echo "posttrain_demo ($SCALE, base only): $OUT/sft/checkpoint"; exit 0; fi

# 3. RL from the SFT model (DAPO, lambda 1), then the partial-rollout timing runs.
rl_config() {  # $1 file, $2 steps, $3 lambda, $4 loss, $5 eval_every
cat > "$1" <<JSON
{"model": "$OUT/sft/checkpoint",
 "arithmetic": {"digits": [1, 2, 3], "ops": "+*", "efforts": ["low", "high", "max"], "tool_share": 0.25,
                "problems": 100000, "seed": 21},
 "eval": {"digits": [1, 2, 3], "ops": "+*", "efforts": ["low", "high", "max"], "tool_share": 0.0,
          "problems": $EVAL_PROBLEMS, "seed": 977},
 "eval_every": $5, "eval_samples": $EVAL_K,
 "steps": $2, "prompts_per_step": $RL_PROMPTS, "group_size": $G, "budgets": $BUDGETS,
 "tool_budgets": $TOOL_BUDGETS, "lambda": $3,
 "loss": "$4", "lr": 3e-4, "optimizer": "adamw", "threads": $THREADS, "checkpoint_every": 10, "seed": 5}
JSON
}
rl_config "$OUT/rl.json" $RL_STEPS 1.0 dapo 0
"$K3CPP" rl --config "$OUT/rl.json" --out "$OUT/rl" --quiet
T4=$(t)
# The same first steps three ways, back to back: lambda 1 (DAPO), mirror descent, lambda 0.75.
rl_config "$OUT/rl-lambda1.json" $PARTIAL_STEPS 1.0 dapo 0
"$K3CPP" rl --config "$OUT/rl-lambda1.json" --out "$OUT/rl-lambda1" --quiet
rl_config "$OUT/rl-mirror.json" $PARTIAL_STEPS 1.0 mirror 0
"$K3CPP" rl --config "$OUT/rl-mirror.json" --out "$OUT/rl-mirror" --quiet
rl_config "$OUT/rl-partial.json" $PARTIAL_STEPS 0.75 dapo 0
"$K3CPP" rl --config "$OUT/rl-partial.json" --out "$OUT/rl-partial" --quiet
T5=$(t)

# 4. Held-out evaluation, SFT and RL models, without and with the tool.
for m in sft rl; do
  for share in 0 1; do
    "$K3CPP" rl --config "$OUT/rl.json" --eval "$OUT/$m/checkpoint" --tool-share $share --samples $EVAL_K \
      > "$OUT/eval-$m-tool$share.json"
  done
done
T6=$(t)
python3 "$HERE/tools/plot_posttrain.py" "$OUT/curves.svg" "$OUT/sft/metrics.jsonl" "$OUT/rl/metrics.jsonl" \
  "$OUT/rl-lambda1/metrics.jsonl" "$OUT/rl-mirror/metrics.jsonl" "$OUT/rl-partial/metrics.jsonl"
python3 "$HERE/tools/plot_posttrain.py" --report "$OUT/report.json" "$OUT" \
  "$(elapsed $T1 $T2)" "$(elapsed $T2 $T3)" "$(elapsed $T3 $T4)" "$(elapsed $T4 $T5)" "$(elapsed $T5 $T6)"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [r[k]['overall']['pass@1'] for k in ('sft_tool0','sft_tool1','rl_tool0','rl_tool1')]" "$OUT/report.json"
echo "posttrain_demo ($SCALE): $(elapsed $T0 $(t)) s; report $OUT/report.json, curves $OUT/curves.svg"
