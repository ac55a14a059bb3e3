// On-policy distillation of specialised policies into one student (`k3cpp distill --config
// distill.json --out DIR`; docs/model.md section 12: multi-teacher on-policy distillation).
// Each step the student samples completions of arithmetic prompts (posttrain/rollout.h, its
// own policy, its own budgets); each trajectory is scored by the teacher that matches its
// prompt (by "tool": the tool or the no-tool teacher; by "effort": the effort's teacher), and
// the student minimises the token-level reverse KL over its generated tokens (tool results
// and prompts masked):
//   L = (1/N) sum_{generated t} KL(pi_student(. | prefix_t) || pi_teacher(. | prefix_t))
// (posttrain/token_grad.h reverse_kl_backward_t, full-vocabulary rows; mode seeking, and on
// the student's own prefixes so there is no exposure bias). Teachers must share the student's
// vocabulary. Checkpoints as in policy_update.h; resume exact.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "posttrain/arith_task.h"
#include "posttrain/policy_update.h"

namespace k3 {

struct DistillConfig {
  std::string path, model;            // the student's starting point
  std::string by = "tool";            // tool | effort
  std::map<std::string, std::string> teachers;  // tool/no_tool or low/high/max -> model dir
  ArithFamily train;
  int64_t steps = 10, prompts_per_step = 8, samples = 1;
  int64_t budget_low = 24, budget_high = 96, budget_max = 192;
  double lr = 1e-4, lr_end = 1e-4;
  UpdateOptions update;
  int max_tool_rounds = 2;
  int64_t checkpoint_every = 10;
  uint64_t seed = 1;
};
DistillConfig load_distill_config(const std::string& path);

struct DistillResult {
  int64_t steps = 0;
  double last_kl = 0;  // mean reverse KL per generated token, last step
  std::string checkpoint_dir;
};

DistillResult run_distill(const DistillConfig& c, const std::string& out_dir, bool resume, int64_t stop_at_step,
                          bool quiet);

}  // namespace k3
