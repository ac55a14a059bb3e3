// Evaluation of a policy on arithmetic problems: k samples per problem at temperature 1
// (posttrain/rollout.h, batched), each verified exactly. Per bucket (operand digits x
// operator x effort x tool) and overall: pass@1 (mean correctness over the k samples, the
// unbiased estimate), pass@k (share of problems with at least one correct sample), mean
// generated tokens, share over budget, tool calls per answer and the calculator's success rate.
#pragma once
#include <cstdint>
#include <functional>

#include <nlohmann/json.hpp>

#include "infer/chat_vocab.h"
#include "posttrain/arith_task.h"
#include "posttrain/rollout.h"
#include "posttrain/verifier.h"

namespace k3 {

struct ImageTask;

struct ArithEvalOptions {
  int64_t samples = 8;  // k
  std::function<int64_t(chat::Effort, bool tool)> budget;
  int max_tool_rounds = 2;
  uint64_t seed = 12345;
  int64_t batch = 32;   // trajectories decoded together
  // Image prompts (posttrain/image_task.h): the family's problems from the held-out split,
  // rendered into the user turn; buckets and per_problem entries add "carry" (ones column).
  const ImageTask* image = nullptr;
};

// {"overall": {...}, "buckets": [{"digits", "op", "effort", "tool", "problems", "pass@1",
//  "pass@k", "k", "mean_tokens", "over_budget", "malformed", "tool_calls_per_answer",
//  "tool_success"}...],
//  "per_problem": [[digits, op, effort, tool, correct samples of k(, carry)], ...] in problem
//  order; carry (0/1) for image problems only}
// (per_problem gives standard errors clustered by problem, and paired differences between
// two models evaluated on the same problems with the same draws).

nlohmann::json evaluate_arith(const K3Model& model, const ChatVocab& vocab, const ArithFamily& f,
                              const ArithEvalOptions& o);

}  // namespace k3
