// Rollouts (posttrain/rollout.h) on the tiny release-layout model (random weights, K3's
// special layout): effort budgets and their -1 reward, partial rollouts resumed on their saved
// decode state (the importance ratio equals the one computed from scratch), and the tool step
// (results appended as non-loss tokens that get exactly zero gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "common/fixture.h"
#include "common/tiny_vocab.h"
#include "core/threads.h"
#include "io/chat_render.h"
#include "model/checkpoint.h"
#include "posttrain/arith_eval.h"
#include "posttrain/arith_task.h"
#include "posttrain/chat_tokens.h"
#include "posttrain/rl.h"
#include "posttrain/rollout.h"
#include "posttrain/token_grad.h"
#include "posttrain/verifier.h"

using namespace k3;

namespace {

using k3::test::kReleaseTiny;

K3Model load_tiny() {
  LoadOptions lo;
  lo.dequantize_experts = true;
  lo.log = [](const std::string&) {};
  return load_model(kReleaseTiny, lo);
}

using k3::test::tiny_vocab;

Trajectory traj(int64_t item, uint64_t id, chat::Effort e, int64_t budget, bool tool = false) {
  const ArithProblem p = make_problem(2, '+', uint64_t(item));
  Trajectory t = make_trajectory(prompt_conversation(p, e, tool), tiny_vocab(), id);
  t.answer = p.answer(), t.effort = e, t.budget = budget, t.tool = tool;
  return t;
}

// logp of every target of ids under `a` for ids[0, cut) and `b` after: a prefill by a, then a
// prefill by b continuing a's state (no state saved between calls, everything recomputed).
std::vector<double> two_policy_logprobs(const K3Model& a, const K3Model& b, const std::vector<int32_t>& ids, size_t cut) {
  const int64_t V = a.dims().V;
  DecodeState st = a.new_state();
  ForwardScratch fs;
  std::vector<float> la(ids.size() * size_t(V));
  ForwardOptions fo;
  a.forward(la.data(), ids.data(), int64_t(cut), st, fs, fo);
  b.forward(la.data() + cut * size_t(V), ids.data() + cut, int64_t(ids.size() - cut), st, fs, fo);
  std::vector<double> lp(ids.size() - 1);
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* l = la.data() + t * size_t(V);
    double mx = l[0], z = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(l[v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(l[v]) - mx);
    lp[t] = double(l[ids[t + 1]]) - mx - std::log(z);
  }
  return lp;
}

}  // namespace

TEST(Rollout, EffortIsAnnouncedAndBudgetsGiveMinusOne) {
  const K3Model m = load_tiny();
  RLConfig c;
  c.budget_low = 2, c.budget_high = 5, c.budget_max = 9;
  std::vector<Trajectory> ts;
  for (chat::Effort e : {chat::Effort::low, chat::Effort::high, chat::Effort::max}) {
    ts.push_back(traj(1, uint64_t(e) + 1, e, c.budget(e)));
    // The prompt carries the thinking-effort system message naming the effort in force.
    const std::string prompt = tiny_vocab().tok.decode(ts.back().ids);
    EXPECT_NE(prompt.find("type=\"thinking-effort\""), std::string::npos);
    EXPECT_NE(prompt.find(chat::effort_name(e)), std::string::npos);
  }
  std::vector<Trajectory*> p;
  for (auto& t : ts) p.push_back(&t);
  advance(m, tiny_vocab(), p, 3, 0, {});
  const RewardOptions ro;
  for (const Trajectory& t : ts) {
    ASSERT_TRUE(t.finished);
    // A random policy does not close its reply within a few tokens: every one runs over.
    EXPECT_EQ(t.finish, "budget");
    EXPECT_EQ(t.generated, t.budget);
    // Over budget is -1 whatever the response says, even a correct one.
    EXPECT_EQ(reward_of(Verdict::correct, t.finish == "budget", ro), -1.0);
  }
  EXPECT_EQ(ts[0].generated, 2);
  EXPECT_EQ(ts[2].generated, 9);
  // A reply that ends before its budget is not penalised: the budget is a cap, not a length.
  Trajectory done = traj(1, 77, chat::Effort::max, 9);
  done.ids.push_back(tiny_vocab().markers.end_of_msg), done.gen.push_back(1), done.behav_logp.push_back(0), done.version.push_back(0);
  done.generated = 1;
  end_turn(done, tiny_vocab(), {});
  EXPECT_EQ(done.finish, "stop");
}

TEST(Rollout, ResumedPartialRolloutRatioEqualsFromScratch) {
  set_num_threads(1);
  K3Model policy = load_tiny();
  const K3Model a = load_tiny();
  std::vector<Trajectory> ts, whole;
  for (int i = 0; i < 3; ++i) ts.push_back(traj(i, 100 + uint64_t(i), chat::Effort::max, 12 + 4 * i));
  whole = {traj(0, 100, chat::Effort::max, 12), traj(1, 101, chat::Effort::max, 16), traj(2, 102, chat::Effort::max, 20)};
  std::vector<Trajectory*> p, q;
  for (auto& t : ts) p.push_back(&t);
  for (auto& t : whole) q.push_back(&t);
  // Uninterrupted under policy A.
  advance(a, tiny_vocab(), q, 3, 0, {});
  // Partial: stop once one has finished (the 12-token one), then change the policy and resume.
  advance(policy, tiny_vocab(), p, 1, 0, {});
  ASSERT_TRUE(ts[0].finished);
  ASSERT_FALSE(ts[2].finished);
  const size_t cut = ts[2].ids.size() - 1;  // the last id was drawn but not yet fed: it is pending
  ASSERT_EQ(ts[2].to_feed.size(), 1u);
  // Policy B: every weight moved (an optimiser step, in place, as the RL loop does).
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.02f);
  float* w = policy.weights().data();
  for (int64_t i = 0; i < policy.weights().size(); ++i) w[i] += nd(rng) * (std::fabs(w[i]) + 0.01f);
  advance(policy, tiny_vocab(), p, 3, 1, {});
  const Trajectory& r = ts[2];
  ASSERT_TRUE(r.finished);
  // Tokens before the pause: same tokens and logprobs as the uninterrupted run (version 0).
  for (size_t k = size_t(r.prompt_len); k <= cut; ++k) {
    EXPECT_EQ(r.ids[k], whole[2].ids[k]);
    EXPECT_EQ(r.version[k], 0);
    EXPECT_NEAR(r.behav_logp[k], whole[2].behav_logp[k], 1e-4);
  }
  for (size_t k = cut + 1; k < r.ids.size(); ++k) EXPECT_EQ(r.version[k], 1);
  // From scratch: A over the prefix that A's state had consumed (every id before the pending
  // one), then B continuing; the recorded behaviour logprobs are these.
  const std::vector<double> scratch = two_policy_logprobs(a, policy, r.ids, cut);
  for (size_t k = size_t(r.prompt_len); k < r.ids.size(); ++k) EXPECT_NEAR(r.behav_logp[k], scratch[k - 1], 2e-4) << k;
  // The ratio the loss uses (current policy B from scratch over the recorded logprob) equals
  // the ratio from scratch: B / A before the pause, B / B-on-A's-state after.
  TrainScratch s;
  std::vector<double> cur(r.ids.size() - 1);
  sequence_logprobs_t<float>(policy, r.ids.data(), int64_t(cur.size()), s, cur.data());
  for (size_t k = size_t(r.prompt_len); k < r.ids.size(); ++k) {
    const double resumed = std::exp(cur[k - 1] - double(r.behav_logp[k]));
    const double from_scratch = std::exp(cur[k - 1] - scratch[k - 1]);
    EXPECT_NEAR(resumed, from_scratch, 3e-4 * from_scratch) << k;
  }
  // The policy change is visible: tokens before the pause have ratios away from 1.
  double dev = 0;
  for (size_t k = size_t(r.prompt_len); k <= cut; ++k) dev = std::max(dev, std::fabs(cur[k - 1] - double(r.behav_logp[k])));
  EXPECT_GT(dev, 1e-3);
  set_num_threads(0);
}

TEST(Rollout, ToolResultsAreAppendedAsMaskedTokens) {
  const K3Model m = load_tiny();
  Trajectory t = traj(3, 5, chat::Effort::low, 1000, /*tool=*/true);
  // The model's turn: a calculator call, as the chat format renders it.
  chat::Conversation c = t.prompt;
  c.options.add_generation_prompt = false;
  chat::Message a;
  a.role = chat::Role::assistant;
  a.reasoning = "";
  chat::ToolCall call;
  call.name = "calculator";
  call.arguments = chat::Json::object({{"expression", "47*85"}});
  a.tool_calls.push_back(call);
  chat::Conversation with = c;
  with.messages.push_back(a);
  const std::vector<int32_t> turn = tiny_vocab().encode(segment_suffix(chat::render(t.prompt), chat::render(with), "test"));
  for (int32_t id : turn) t.ids.push_back(id), t.gen.push_back(1), t.behav_logp.push_back(-1.f), t.version.push_back(0);
  t.generated = int64_t(turn.size());
  const size_t before = t.ids.size();
  end_turn(t, tiny_vocab(), {});
  ASSERT_FALSE(t.finished);
  EXPECT_EQ(t.tool_calls, 1);
  EXPECT_EQ(t.tool_ok, 1);
  ASSERT_GT(t.ids.size(), before);
  const std::string added = tiny_vocab().tok.decode(std::vector<int32_t>(t.ids.begin() + std::ptrdiff_t(before), t.ids.end()));
  EXPECT_NE(added.find("role=\"tool\" tool=\"calculator\""), std::string::npos);
  EXPECT_NE(added.find("3995"), std::string::npos);
  // Ends with the next generation prompt; the tool message tokens are no loss tokens.
  const std::string gp = "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
  ASSERT_GE(added.size(), gp.size());
  EXPECT_EQ(added.substr(added.size() - gp.size()), gp);
  for (size_t k = before; k < t.ids.size(); ++k) EXPECT_EQ(t.gen[k], 0);
  EXPECT_EQ(t.to_feed.size(), t.ids.size() - before + 1);  // <|end_of_msg|> + the tool message
  // The loss on this trajectory: tool-result targets get exactly zero dlogits.
  TrainScratch s;
  std::vector<float> g(size_t(m.weights().size()), 0.f);
  const int64_t T = int64_t(t.ids.size()) - 1;
  token_objective_backward_t<float>(m, t.ids.data(), T,
                                    [&](const double* lp, int64_t n, double* cc) {
                                      for (int64_t k = 0; k < n; ++k) cc[k] = t.gen[size_t(k + 1)] ? -lp[k] * 0.01 - 0.1 : 0.0;
                                      return 0.0;
                                    },
                                    g.data(), s);
  const int64_t V = m.dims().V;
  for (int64_t k = 0; k < T; ++k) {
    double row = 0;
    for (int64_t v = 0; v < V; ++v) row += std::fabs(double(s.logits[size_t(k * V + v)]));
    if (t.gen[size_t(k + 1)]) EXPECT_GT(row, 0.0);
    else ASSERT_EQ(row, 0.0) << k;
  }
  // The continuation runs: the tool message is prefilled onto the saved state.
  t.budget = t.generated + 6;
  std::vector<Trajectory*> p = {&t};
  advance(m, tiny_vocab(), p, 1, 0, {});
  EXPECT_TRUE(t.finished);
  EXPECT_GT(t.generated, int64_t(turn.size()));
  EXPECT_EQ(t.gen[t.ids.size() - 1], 1);
}

// Prompts that declare the calculator run under tool_budgets (a call's markup counts, so a
// tool reply needs more tokens than a plain one at the same effort); the others under
// budgets. The random policy never closes its reply, so each sample's length is its budget.
TEST(Rollout, ToolPromptsRunUnderTheirOwnBudgets) {
  const K3Model m = load_tiny();
  RLConfig c;
  c.budget_low = 3, c.budget_high = 4, c.budget_max = 5;
  c.tool_budget_low = 7, c.tool_budget_high = 8;  // max not given: the effort's budget
  ArithFamily f;
  f.bands = {{1, '+'}};
  f.tool_share = 0.5;
  f.problems = 12;
  ArithEvalOptions eo;
  eo.samples = 1;
  eo.budget = [&](chat::Effort e, bool tool) { return c.budget(e, tool); };
  const nlohmann::json r = evaluate_arith(m, tiny_vocab(), f, eo);
  std::set<std::pair<std::string, bool>> seen;
  for (const auto& b : r["buckets"]) {
    const std::string e = b["effort"];
    const bool tool = b["tool"];
    seen.insert({e, tool});
    const int64_t want = e == "low" ? (tool ? 7 : 3) : e == "high" ? (tool ? 8 : 4) : 5;
    EXPECT_EQ(b["mean_tokens"].get<double>(), double(want)) << e << " tool " << tool;
    EXPECT_EQ(b["over_budget"].get<double>(), 1.0);
  }
  EXPECT_GE(seen.size(), 5u);  // low and high with and without the tool, and max
}
