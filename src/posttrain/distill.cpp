// On-policy multi-teacher distillation (see distill.h).
#include "posttrain/distill.h"

#include <chrono>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "infer/chat_vocab.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"
#include "posttrain/config_reader.h"
#include "posttrain/rollout.h"
#include "posttrain/sft.h"
#include "posttrain/token_grad.h"
#include "train/metrics.h"

namespace fs = std::filesystem;

namespace k3 {

DistillConfig load_distill_config(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  DistillConfig c;
  c.path = path;
  ConfigReader rd(j, path);
  if (!rd.get("model", c.model)) rd.bad("model", "missing (the student's starting model directory)");
  c.model = resolve_config_path(path, c.model);
  rd.get("by", c.by);
  if (c.by != "tool" && c.by != "effort") rd.bad("by", "must be tool or effort");
  if (!rd.get("teachers", c.teachers) || c.teachers.size() < 2) rd.bad("teachers", "needs at least two teachers");
  for (auto& [k, v] : c.teachers) {
    const bool ok = c.by == "tool" ? (k == "tool" || k == "no_tool") : (k == "low" || k == "high" || k == "max");
    if (!ok) rd.bad("teachers", "'" + k + "' is not a " + (c.by == "tool" ? "tool / no_tool" : "low / high / max") + " key");
    v = resolve_config_path(path, v);
  }
  if (const nlohmann::json* a = rd.sub("arithmetic")) c.train = parse_arith_family(*a, path, "arithmetic");
  else rd.bad("arithmetic", "missing (the prompts)");
  rd.get("steps", c.steps);
  rd.get("prompts_per_step", c.prompts_per_step);
  rd.get("samples", c.samples);
  read_effort_budgets(rd, "budgets", c.budget_low, c.budget_high, c.budget_max);
  rd.get("lr", c.lr);
  c.lr_end = c.lr;
  rd.get("lr_end", c.lr_end);
  rd.get("optimizer", c.update.optimizer);
  rd.get("grad_clip", c.update.grad_clip);
  rd.get("threads", c.update.threads);
  rd.get("max_tool_rounds", c.max_tool_rounds);
  rd.get("checkpoint_every", c.checkpoint_every);
  rd.get("seed", c.seed);
  rd.finish();
  if (c.steps < 1 || c.prompts_per_step < 1 || c.samples < 1) rd.bad("steps", "steps, prompts_per_step and samples must be positive");
  if (c.budget_low < 1 || c.budget_high < 1 || c.budget_max < 1) rd.bad("budgets", "every budget must be at least 1");
  if (!(c.lr > 0)) rd.bad("lr", "must be positive");
  if (c.checkpoint_every < 1) rd.bad("checkpoint_every", "must be at least 1");
  return c;
}

DistillResult run_distill(const DistillConfig& c, const std::string& out_dir, bool resume, int64_t stop_at_step,
                          bool quiet) {
  if (out_dir.empty()) fail("distill: --out is required");
  const std::string ckpt = (fs::path(out_dir) / "checkpoint").string();
  if (resume && !fs::exists(ckpt)) fail("distill --resume: " + ckpt + " does not exist");
  LoadOptions lo;
  lo.dequantize_experts = true;
  const ModelDir md = open_model_dir(resume ? ckpt : c.model);
  K3Model student = load_model(md, lo);
  const ChatVocab vocab = load_chat_vocab(md);
  const Vocabulary voc = Vocabulary::load_dir(md.dir);
  std::map<std::string, K3Model> teachers;
  for (const auto& [k, dir] : c.teachers) {
    const ModelDir tmd = open_model_dir(dir);
    if (Vocabulary::load_dir(tmd.dir).identity() != voc.identity())
      fail_input(c.path, "teachers." + k, dir + " has another vocabulary than the student");
    teachers.emplace(k, load_model(tmd, lo));
    if (teachers.at(k).dims().V != student.dims().V) fail_input(c.path, "teachers." + k, "vocabulary size differs");
  }
  PolicyUpdater up(student, c.update);
  const std::string cfg_fp = read_json_file(c.path).dump();
  int64_t step = 0;
  MetricsLog metrics;
  make_directories(out_dir);
  const std::string mpath = (fs::path(out_dir) / "metrics.jsonl").string();
  if (resume) {
    const nlohmann::json st = up.load_state(ckpt);
    if (st.value("kind", "") != "distill" || st.value("config", "") != cfg_fp)
      fail_input(c.path, "", "differs from the config the checkpoint in " + ckpt + " was trained with");
    step = st.at("step").get<int64_t>();
    metrics.open(mpath, step);
  } else {
    metrics.open(mpath);
    metrics.write({{"type", "run"}, {"kind", "distill"}, {"by", c.by}, {"teachers", c.teachers}});
  }
  auto budget = [&](chat::Effort e) {
    return e == chat::Effort::low ? c.budget_low : e == chat::Effort::high ? c.budget_high : c.budget_max;
  };
  auto teacher_key = [&](const Trajectory& t) -> std::string {
    if (c.by == "tool") return t.tool ? "tool" : "no_tool";
    return chat::effort_name(t.effort);
  };
  const int64_t end = stop_at_step >= 0 ? std::min(stop_at_step, c.steps) : c.steps;
  DistillResult res;
  res.checkpoint_dir = ckpt;
  RolloutOptions ro;
  ro.seed = c.seed;
  ro.max_tool_rounds = c.max_tool_rounds;
  while (step < end) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Trajectory> ts;
    for (int64_t j = 0; j < c.prompts_per_step; ++j) {
      const int64_t item = step * c.prompts_per_step + j;
      const ArithItem it = arith_item(c.train, item);
      for (int64_t s = 0; s < c.samples; ++s) {
        Trajectory t = make_trajectory(prompt_conversation(it.problem, it.effort, it.tool), vocab,
                                       uint64_t(item) * 4096 + uint64_t(s));
        t.answer = it.problem.answer(), t.effort = it.effort, t.tool = it.tool, t.budget = budget(it.effort);
        // Only prompts some teacher covers.
        if (teachers.count(teacher_key(t))) ts.push_back(std::move(t));
      }
    }
    std::vector<Trajectory*> p;
    for (auto& t : ts) p.push_back(&t);
    advance(student, vocab, p, int64_t(p.size()), int32_t(step), ro);
    int64_t N = 0;
    for (auto& t : ts)
      for (size_t k = 1; k < t.ids.size(); ++k) N += t.gen[k];
    std::vector<double> kl(ts.size(), 0.0);
    UpdateStats us;
    const double lr = posttrain_lr(step, c.steps, c.lr, c.lr_end, 0);
    if (N > 0)
      us = up.step(
          int64_t(ts.size()),
          [&](int64_t i, float* g, TrainScratch& s) {
            const Trajectory& t = ts[size_t(i)];
            const int64_t T = int64_t(t.ids.size()) - 1;
            std::vector<double> logq;
            sequence_log_softmax_t<float>(teachers.at(teacher_key(t)), t.ids.data(), T, s, logq);
            kl[size_t(i)] = reverse_kl_backward_t<float>(student, t.ids.data(), T, logq.data(), t.gen.data() + 1,
                                                         1.0 / double(N), g, s);
          },
          lr);
    double total = 0;
    for (double k : kl) total += k;
    res.last_kl = N > 0 ? total / double(N) : 0.0;
    ++step;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    metrics.write({{"type", "step"}, {"step", step}, {"kl", res.last_kl}, {"tokens", N}, {"trajectories", ts.size()},
                   {"grad_norm", us.grad_norm}, {"lr", lr}, {"seconds", secs}});
    if (!quiet) std::fprintf(stderr, "distill step %lld/%lld kl %.4f [%.1f s]\n", (long long)step, (long long)c.steps, res.last_kl, secs);
    if (step % c.checkpoint_every == 0 && step < end)
      up.save(ckpt, voc, {{"kind", "distill"}, {"step", step}, {"config", cfg_fp}});
  }
  up.save(ckpt, voc, {{"kind", "distill"}, {"step", step}, {"config", cfg_fp}});
  metrics.write({{"type", step == c.steps ? "end" : "stopped"}, {"step", step}});
  res.steps = step;
  return res;
}

}  // namespace k3
