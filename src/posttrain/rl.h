// RL with verifiable rewards (`k3cpp rl --config rl.json --out DIR`), from an SFT model:
//  1. Rollout: prompts_per_step new arithmetic prompts (posttrain/arith_task.h), each at its
//     effort (announced in the prompt by the thinking-effort system message) with the effort's
//     token budget, G completions each, decoded together (posttrain/rollout.h) with the current
//     policy; with partial rollouts (lambda < 1) the step proceeds once a fraction lambda of the
//     buffer's trajectories has finished, the rest stay in the buffer and continue next step.
//  2. Rewards (posttrain/verifier.h): the last assistant turn's response checked exactly;
//     correct 1, wrong 0, malformed -format_penalty, over budget -1.
//  3. Groups whose trajectories have all finished are trained: group-relative advantages,
//     zero-variance groups dropped, the DAPO clipped token-level loss (default) or k1.5's
//     mirror-descent squared loss (posttrain/policy_loss.h), optional KL to the reference
//     (the starting model), the ratio against each token's recorded behaviour logprob
//     (truncated IS for tokens of older policies); one optimiser step per RL step.
// Tool-result tokens are never loss tokens (Trajectory::gen = 0).
//
// Why DAPO is the default: its loss is per token with a per-token clip, so a token drawn by an
// older policy (partial rollouts) moves the policy by a bounded amount, and long and short
// replies weigh by their tokens; the mirror-descent loss regularises the sequence log-ratio
// sum_t log(pi/pi_old), which grows with length and has no per-token bound.
// Checkpoint (policy_update.h) every checkpoint_every steps and at the end, with the partial
// rollouts in the buffer (posttrain/rollout_io.h: tokens, behaviour logprobs, versions, the
// decode state itself), so --resume continues exactly, bitwise, at any lambda.
// Curriculum: the prompts are the "arithmetic" family, which may name bands ("bands":
// ["2+", "3+"], operand digits x operator) to train only where the model is at the edge.
// Images: with "task": "image_arithmetic" the same family's 2-digit additions are rendered
// images in the user turn (posttrain/image_task.h); the frozen encoder's rows are spliced into
// the rollout's prefill, the loss's and the reference's forwards, image positions carry no
// loss, and the checkpoint carries the encoder (vision.safetensors) so it is a vision model
// directory; training problems come from the "train" split of operand pairs, eval from "heldout".
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "posttrain/arith_task.h"
#include "posttrain/image_task.h"
#include "posttrain/policy_loss.h"
#include "posttrain/policy_update.h"
#include "posttrain/verifier.h"

namespace k3 {

struct RLConfig {
  std::string path, model;
  // "task": arithmetic (text prompts) or image_arithmetic (the vision issue's rendered problems
  // in the user turn, posttrain/image_task.h; needs a model with a vision encoder, frozen).
  PosttrainTask task = PosttrainTask::arithmetic;
  std::string unifont = "/usr/share/unifont/unifont.hex";  // image_arithmetic: the renderer's font
  ArithFamily train;                  // the prompts (problem i at step s: i = s * prompts_per_step + j)
  std::optional<ArithFamily> eval;    // held-out problems evaluated every eval_every steps
  int64_t eval_every = 0, eval_samples = 4;
  int64_t steps = 20, prompts_per_step = 4, group_size = 8;
  int64_t budget_low = 24, budget_high = 96, budget_max = 192;
  // Budgets of prompts that declare the calculator ("tool_budgets"; -1: the same as budgets).
  // Every token the model draws counts, the call's markup included (tool results do not: the
  // environment wrote them); a call has a fixed cost in tokens (about 50 in the demo's
  // vocabulary) that no effort shortens, so tool prompts get their own, larger budgets.
  int64_t tool_budget_low = -1, tool_budget_high = -1, tool_budget_max = -1;
  double lambda = 1.0;                // partial rollouts: fraction finished before a step proceeds
  PolicyLossOptions loss;
  RewardOptions reward;
  double lr = 1e-4, lr_end = 1e-4;
  int64_t warmup_steps = 0;
  UpdateOptions update;
  int max_tool_rounds = 2;
  int64_t checkpoint_every = 10, log_every = 1;
  uint64_t seed = 1;
  int64_t budget(chat::Effort e, bool tool = false) const {
    const int64_t b = e == chat::Effort::low ? budget_low : e == chat::Effort::high ? budget_high : budget_max;
    if (!tool) return b;
    const int64_t tb = e == chat::Effort::low ? tool_budget_low : e == chat::Effort::high ? tool_budget_high : tool_budget_max;
    return tb > 0 ? tb : b;
  }
};
RLConfig load_rl_config(const std::string& path);

struct RLOptions {
  std::string out_dir;
  bool resume = false;
  int64_t stop_at_step = -1;
  bool quiet = false;
  std::FILE* log = stderr;
};

struct RLResult {
  int64_t steps = 0;
  double last_reward = 0;
  std::string checkpoint_dir;
};

RLResult run_rl(const RLConfig& c, const RLOptions& o);

}  // namespace k3
