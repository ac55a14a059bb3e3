// Arithmetic evaluation (see arith_eval.h).
#include "posttrain/arith_eval.h"

#include <map>
#include <tuple>

#include "posttrain/image_task.h"

namespace k3 {

namespace {
struct Acc {
  int64_t problems = 0, samples = 0, correct = 0, any = 0, tokens = 0, over = 0, answers = 0, calls = 0, ok = 0;
  int64_t malformed = 0;  // within budget, but no single canonical integer (verifier.h)
  nlohmann::json json(int64_t k) const {
    auto div = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    return {{"problems", problems}, {"k", k}, {"pass@1", div(correct, samples)}, {"pass@k", div(any, problems)},
            {"mean_tokens", div(tokens, samples)}, {"over_budget", div(over, samples)},
            {"malformed", div(malformed, samples)},
            {"tool_calls_per_answer", div(calls, answers)}, {"tool_success", div(ok, calls)}};
  }
};
}  // namespace

nlohmann::json evaluate_arith(const K3Model& model, const ChatVocab& vocab, const ArithFamily& f,
                              const ArithEvalOptions& o) {
  using Key = std::tuple<int, char, int, bool, int>;  // digits, op, effort, tool, carry (-1: text)
  std::map<Key, Acc> buckets;
  Acc all;
  std::vector<Trajectory> ts;
  std::vector<ArithItem> items;
  nlohmann::json per_problem = nlohmann::json::array();
  auto flush = [&]() {
    if (ts.empty()) return;
    std::vector<Trajectory*> ptr;
    for (auto& t : ts) ptr.push_back(&t);
    RolloutOptions ro;
    ro.seed = o.seed;
    ro.max_tool_rounds = o.max_tool_rounds;
    advance(model, vocab, ptr, int64_t(ptr.size()), 0, ro);
    for (size_t p = 0; p < items.size(); ++p) {
      const ArithItem& it = items[p];
      const int carry = o.image ? image_carry(it.problem) : -1;
      Acc& b = buckets[Key{it.problem.digits, it.problem.op, int(it.effort), it.tool, carry}];
      bool any = false;
      int64_t n_ok = 0;
      for (int64_t s = 0; s < o.samples; ++s) {
        const Trajectory& t = ts[p * size_t(o.samples) + size_t(s)];
        const bool over = t.finish == "budget";
        const Verdict v = t.responses.empty() ? Verdict::malformed : verify_answer(t.responses.back(), t.answer);
        const bool ok = !over && v == Verdict::correct;
        any |= ok;
        n_ok += ok;
        for (Acc* a : {&b, &all}) {
          a->samples++, a->correct += ok, a->tokens += t.generated, a->over += over;
          a->malformed += !over && v == Verdict::malformed;
          a->answers++, a->calls += t.tool_calls, a->ok += t.tool_ok;
        }
      }
      for (Acc* a : {&b, &all}) a->problems++, a->any += any;
      nlohmann::json pp = {it.problem.digits, std::string(1, it.problem.op), chat::effort_name(it.effort), it.tool, n_ok};
      if (carry >= 0) pp.push_back(carry);
      per_problem.push_back(pp);
    }
    ts.clear();
    items.clear();
  };
  for (int64_t i = 0; i < f.problems; ++i) {
    const ArithItem it = o.image ? image_arith_item(f, i, true) : arith_item(f, i);
    items.push_back(it);
    const Trajectory proto = o.image ? make_image_trajectory(*o.image, it.problem, it.effort, vocab, 0)
                                     : make_trajectory(prompt_conversation(it.problem, it.effort, it.tool), vocab, 0);
    for (int64_t s = 0; s < o.samples; ++s) {
      Trajectory t = proto;
      t.id = uint64_t(i) * 1000003ull + uint64_t(s);
      t.answer = it.problem.answer();
      t.effort = it.effort;
      t.tool = it.tool;
      t.budget = o.budget(it.effort, it.tool);
      ts.push_back(std::move(t));
    }
    if (int64_t(ts.size()) >= o.batch) flush();
  }
  flush();
  nlohmann::json out;
  out["overall"] = all.json(o.samples);
  out["per_problem"] = per_problem;
  out["buckets"] = nlohmann::json::array();
  for (const auto& [k, a] : buckets) {
    nlohmann::json j = a.json(o.samples);
    j["digits"] = std::get<0>(k);
    j["op"] = std::string(1, std::get<1>(k));
    j["effort"] = chat::effort_name(chat::Effort(std::get<2>(k)));
    j["tool"] = std::get<3>(k);
    if (std::get<4>(k) >= 0) j["carry"] = std::get<4>(k) == 1;
    out["buckets"].push_back(j);
  }
  return out;
}

}  // namespace k3
