// The RL loop (see rl.h).
#include "posttrain/rl.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>

#include <omp.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"
#include "posttrain/arith_eval.h"
#include "posttrain/config_reader.h"
#include "posttrain/rollout.h"
#include "posttrain/rollout_io.h"
#include "posttrain/sft.h"
#include "posttrain/token_grad.h"
#include "train/metrics.h"

namespace fs = std::filesystem;

namespace k3 {

namespace {


double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A trajectory's reward (rl.h step 2).
double reward(const Trajectory& t, const RewardOptions& o, Verdict* v_out) {
  const Verdict v = t.responses.empty() ? Verdict::malformed : verify_answer(t.responses.back(), t.answer);
  if (v_out) *v_out = v;
  return reward_of(v, t.finish == "budget", o);
}

}  // namespace

RLConfig load_rl_config(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  RLConfig c;
  c.path = path;
  ConfigReader rd(j, path);
  if (!rd.get("model", c.model)) rd.bad("model", "missing (the SFT model directory)");
  c.model = resolve_config_path(path, c.model);
  c.task = read_posttrain_task(rd, path, &c.unifont);
  const bool image = c.task == PosttrainTask::image_arithmetic;
  if (const nlohmann::json* a = rd.sub("arithmetic")) {
    c.train = parse_arith_family(*a, path, "arithmetic");
    if (image) check_image_family(c.train, *a, path, "arithmetic");
  } else {
    rd.bad("arithmetic", "missing (the training prompts)");
  }
  if (const nlohmann::json* a = rd.sub("eval")) {
    c.eval = parse_arith_family(*a, path, "eval");
    if (image) check_image_family(*c.eval, *a, path, "eval");
  }
  rd.get("eval_every", c.eval_every);
  rd.get("eval_samples", c.eval_samples);
  rd.get("steps", c.steps);
  rd.get("prompts_per_step", c.prompts_per_step);
  rd.get("group_size", c.group_size);
  read_effort_budgets(rd, "budgets", c.budget_low, c.budget_high, c.budget_max);
  read_effort_budgets(rd, "tool_budgets", c.tool_budget_low, c.tool_budget_high, c.tool_budget_max);
  rd.get("lambda", c.lambda);
  std::string loss = "dapo";
  rd.get("loss", loss);
  c.loss.kind = parse_rl_loss(loss, path);
  rd.get("clip_low", c.loss.clip_low);
  rd.get("clip_high", c.loss.clip_high);
  rd.get("is_cap", c.loss.is_cap);
  rd.get("kl_coef", c.loss.kl_coef);
  rd.get("tau", c.loss.tau);
  rd.get("std_norm", c.loss.std_norm);
  rd.get("format_penalty", c.reward.format_penalty);
  rd.get("lr", c.lr);
  c.lr_end = c.lr;
  rd.get("lr_end", c.lr_end);
  rd.get("warmup_steps", c.warmup_steps);
  rd.get("optimizer", c.update.optimizer);
  rd.get("weight_decay", c.update.weight_decay);
  rd.get("grad_clip", c.update.grad_clip);
  rd.get("threads", c.update.threads);
  rd.get("max_tool_rounds", c.max_tool_rounds);
  rd.get("checkpoint_every", c.checkpoint_every);
  rd.get("log_every", c.log_every);
  rd.get("seed", c.seed);
  rd.finish();
  if (!image && j.contains("unifont")) rd.bad("unifont", "only the image_arithmetic task renders images");
  if (image) c.unifont = resolve_config_path(path, c.unifont);
  if (c.steps < 1) rd.bad("steps", "must be at least 1");
  if (c.prompts_per_step < 1) rd.bad("prompts_per_step", "must be at least 1");
  if (c.group_size < 2) rd.bad("group_size", "must be at least 2 (advantages are relative to the group)");
  if (c.budget_low < 1 || c.budget_high < 1 || c.budget_max < 1) rd.bad("budgets", "every budget must be at least 1");
  if (!(c.lambda > 0 && c.lambda <= 1)) rd.bad("lambda", "must be in (0, 1]");
  if (c.loss.clip_low <= 0 || c.loss.clip_low >= 1 || c.loss.clip_high <= 0) rd.bad("clip_low", "clips must be in (0, 1) and > 0");
  if (c.loss.is_cap < 1 + c.loss.clip_high) rd.bad("is_cap", "must be at least 1 + clip_high");
  if (c.loss.kl_coef < 0) rd.bad("kl_coef", "must be non-negative");
  if (c.loss.tau <= 0) rd.bad("tau", "must be positive");
  if (!(c.lr > 0)) rd.bad("lr", "must be positive");
  if (c.update.optimizer != "adamw" && c.update.optimizer != "muon") rd.bad("optimizer", "must be adamw or muon");
  if (c.checkpoint_every < 1) rd.bad("checkpoint_every", "must be at least 1");
  if (c.eval_every < 0 || c.eval_samples < 1) rd.bad("eval_every", "eval_every >= 0 and eval_samples >= 1");
  return c;
}

RLResult run_rl(const RLConfig& c, const RLOptions& o) {
  if (o.out_dir.empty()) fail("rl: --out is required");
  const std::string ckpt = (fs::path(o.out_dir) / "checkpoint").string();
  if (o.resume && !fs::exists(ckpt)) fail("rl --resume: " + ckpt + " does not exist");
  LoadOptions lo;
  lo.dequantize_experts = true;
  const ModelDir md = open_model_dir(o.resume ? ckpt : c.model);
  K3Model model = load_model(md, lo);
  const ChatVocab vocab = load_chat_vocab(md);
  const Vocabulary voc = Vocabulary::load_dir(md.dir);
  std::optional<K3Model> ref;
  if (c.loss.kl_coef > 0) ref.emplace(load_model(c.model, lo));
  // Image prompts: the frozen encoder (the checkpoint's copy on resume: the same bytes).
  std::optional<ImageTask> img;
  if (c.task == PosttrainTask::image_arithmetic) img.emplace(load_image_task(md, c.unifont, c.path));
  auto train_item = [&](int64_t i) { return img ? image_arith_item(c.train, i, false) : arith_item(c.train, i); };
  PolicyUpdater up(model, c.update);
  const std::string cfg_fp = read_json_file(c.path).dump();
  int64_t step = 0;
  MetricsLog metrics;
  make_directories(o.out_dir);
  const std::string mpath = (fs::path(o.out_dir) / "metrics.jsonl").string();
  std::vector<Trajectory> buffer;  // every trajectory not yet trained on (partial rollouts)
  if (o.resume) {
    const nlohmann::json st = up.load_state(ckpt);
    if (st.value("kind", "") != "rl") fail_input(ckpt + "/posttrain_state.json", "state.kind", "is not an RL checkpoint");
    if (st.value("config", "") != cfg_fp) fail_input(c.path, "", "differs from the config the checkpoint in " + ckpt + " was trained with");
    step = st.at("step").get<int64_t>();
    buffer = load_rollouts(ckpt, model);
    if (img)
      for (Trajectory& t : buffer) reattach_image(t, *img, train_item(t.item).problem, ckpt + "/rollouts.json");
    if (int64_t(buffer.size()) != st.value("buffered", int64_t(0)))
      fail_input(ckpt + "/posttrain_state.json", "state.buffered", "differs from the trajectories in rollouts.json");
    metrics.open(mpath, step);
    metrics.write({{"type", "resume"}, {"step", step}, {"restored_partial", buffer.size()}});
  } else {
    metrics.open(mpath);
    metrics.write({{"type", "run"}, {"kind", "rl"}, {"task", posttrain_task_name(c.task)}, {"model", c.model},
                   {"loss", rl_loss_name(c.loss.kind)},
                   {"lambda", c.lambda}, {"group_size", c.group_size}, {"threads", up.threads()}});
  }
  RolloutOptions ro;
  ro.seed = c.seed;
  ro.max_tool_rounds = c.max_tool_rounds;
  const int64_t end = o.stop_at_step >= 0 ? std::min(o.stop_at_step, c.steps) : c.steps;
  auto eval_now = [&](int64_t at) {
    if (!c.eval) return;
    ArithEvalOptions eo;
    eo.samples = c.eval_samples;
    eo.budget = [&](chat::Effort e, bool tool) { return c.budget(e, tool); };
    eo.max_tool_rounds = c.max_tool_rounds;
    eo.image = img ? &*img : nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    nlohmann::json r = evaluate_arith(model, vocab, *c.eval, eo);
    r.erase("per_problem");  // metrics.jsonl keeps the buckets; `k3cpp rl --eval` prints it all
    r["type"] = "eval";
    r["step"] = at;
    r["seconds"] = seconds_since(t0);
    metrics.write(r);
    if (!o.quiet)
      std::fprintf(o.log, "rl eval step %lld: pass@1 %.3f pass@%lld %.3f\n", (long long)at,
                   r["overall"]["pass@1"].get<double>(), (long long)c.eval_samples, r["overall"]["pass@k"].get<double>());
  };
  auto save = [&]() {
    up.save(ckpt, voc, {{"kind", "rl"}, {"step", step}, {"config", cfg_fp}, {"buffered", int64_t(buffer.size())}},
            [&](const std::string& tmp) {
              save_rollouts(tmp, buffer);
              if (img) save_frozen_encoder(tmp, *img, model);
            });
  };
  if (step == 0 && c.eval_every > 0) eval_now(0);
  RLResult res;
  res.checkpoint_dir = ckpt;
  while (step < end) {
    const auto t_step = std::chrono::steady_clock::now();
    // 1. New groups, then decode until lambda of the buffer has finished.
    for (int64_t j = 0; j < c.prompts_per_step; ++j) {
      const int64_t item = step * c.prompts_per_step + j;
      const ArithItem it = train_item(item);
      // The group's prompt, rendered (and its image encoded) once; members differ by id only.
      const Trajectory proto = img ? make_image_trajectory(*img, it.problem, it.effort, vocab, 0)
                                   : make_trajectory(prompt_conversation(it.problem, it.effort, it.tool), vocab, 0);
      for (int64_t g = 0; g < c.group_size; ++g) {
        Trajectory t = proto;
        t.id = uint64_t(item) * 4096 + uint64_t(g);
        t.group = item, t.item = item, t.answer = it.problem.answer(), t.effort = it.effort, t.tool = it.tool;
        t.budget = c.budget(it.effort, it.tool);
        buffer.push_back(std::move(t));
      }
    }
    std::vector<Trajectory*> live;
    for (auto& t : buffer) live.push_back(&t);
    const int64_t need = int64_t(std::ceil(c.lambda * double(live.size()) - 1e-9));
    const RolloutStats rs = advance(model, vocab, live, need, int32_t(step), ro);
    // 2-3. Complete groups are trained; the rest stay.
    std::map<int64_t, int64_t> unfinished;
    for (auto& t : buffer) unfinished[t.group] += t.finished ? 0 : 1;
    std::vector<Trajectory> batch;
    std::vector<Trajectory> keep;
    for (auto& t : buffer) (unfinished[t.group] == 0 ? batch : keep).push_back(std::move(t));
    buffer = std::move(keep);
    std::vector<LossSample> samples(batch.size());
    std::map<std::string, std::pair<double, int64_t>> len_by_effort, over_by_effort;
    double reward_sum = 0;
    int64_t correct = 0, calls = 0, calls_ok = 0, stale_tokens = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Trajectory& t = batch[i];
      Verdict v;
      samples[i].group = t.group;
      samples[i].reward = reward(t, c.reward, &v);
      reward_sum += samples[i].reward;
      correct += v == Verdict::correct && t.finish != "budget";
      calls += t.tool_calls, calls_ok += t.tool_ok;
      const std::string e = chat::effort_name(t.effort);
      len_by_effort[e].first += double(t.generated), len_by_effort[e].second++;
      over_by_effort[e].first += t.finish == "budget" ? 1 : 0, over_by_effort[e].second++;
      // Per target t (token ids[t + 1]) of the whole sequence: the mask and behaviour logprob.
      const size_t T = t.ids.size() - 1;
      samples[i].mask.resize(T), samples[i].behav_logp.resize(T), samples[i].logp.assign(T, 0.0);
      for (size_t k = 0; k < T; ++k) {
        samples[i].mask[k] = t.gen[k + 1];
        samples[i].behav_logp[k] = t.behav_logp[k + 1];
        stale_tokens += t.gen[k + 1] && t.version[k + 1] != int32_t(step) ? 1 : 0;
      }
    }
    std::vector<double> adv;
    std::vector<uint8_t> keepf;
    group_advantages(samples, c.loss.kind == RLLossKind::dapo && c.loss.std_norm, adv, keepf);
    int64_t N = 0, n_kept = 0;
    std::vector<size_t> trained;
    for (size_t i = 0; i < batch.size(); ++i)
      if (keepf[i]) {
        trained.push_back(i), n_kept++;
        for (uint8_t m : samples[i].mask) N += m;
      }
    if (ref) {
      // The reference's logprobs, one sequence per thread (serial BLAS inside: serial_blas.h).
      const int P = up.threads();
#pragma omp parallel for schedule(static) num_threads(P)
      for (size_t j = 0; j < trained.size(); ++j) {
        const size_t i = trained[j];
        samples[i].ref_logp.resize(samples[i].mask.size());
        EmbedSpliceT<float> sp;
        sequence_logprobs_t<float>(*ref, batch[i].ids.data(), int64_t(samples[i].mask.size()),
                                   up.scratch(omp_get_thread_num()), samples[i].ref_logp.data(), batch[i].splice(sp));
      }
    }
    const auto t_upd = std::chrono::steady_clock::now();
    std::vector<PolicyLossResult> part(trained.size());
    std::vector<double> loss(trained.size(), 0.0), ratio(trained.size(), 0.0), klv(trained.size(), 0.0);
    UpdateStats us;
    const double lr = posttrain_lr(step, c.steps, c.lr, c.lr_end, c.warmup_steps);
    if (N > 0) {
      us = up.step(int64_t(trained.size()),
                   [&](int64_t j, float* g, TrainScratch& s) {
                     const size_t i = trained[size_t(j)];
                     LossSample& x = samples[i];
                     EmbedSpliceT<float> sp;  // image rows; their gradient is dropped (frozen encoder)
                     loss[size_t(j)] = token_objective_backward_t<float>(
                         model, batch[i].ids.data(), int64_t(x.mask.size()),
                         [&](const double* logp, int64_t T, double* dl) {
                           std::copy(logp, logp + T, x.logp.begin());
                           std::vector<double> d;
                           const double l = sample_policy_loss(x, adv[i], N, n_kept, c.loss, d, part[size_t(j)],
                                                               ratio[size_t(j)], klv[size_t(j)]);
                           std::copy(d.begin(), d.end(), dl);
                           return l;
                         },
                         g, s, nullptr, batch[i].splice(sp));
                   },
                   lr);
    }
    double L = 0, rsum = 0, ksum = 0;
    int64_t clipped = 0;
    for (size_t j = 0; j < trained.size(); ++j) L += loss[j], rsum += ratio[j], ksum += klv[j], clipped += part[j].clipped;
    ++step;
    const double step_s = seconds_since(t_step);
    res.last_reward = batch.empty() ? 0.0 : reward_sum / double(batch.size());
    nlohmann::json m = {{"type", "step"}, {"step", step}, {"loss", L}, {"reward", res.last_reward},
                        {"correct", batch.empty() ? 0.0 : double(correct) / double(batch.size())},
                        {"trajectories", batch.size()}, {"kept", n_kept}, {"dropped", int64_t(batch.size()) - n_kept},
                        {"loss_tokens", N}, {"stale_tokens", stale_tokens}, {"clipped", clipped},
                        {"mean_ratio", N > 0 ? rsum / double(N) : 1.0}, {"kl", N > 0 ? ksum / double(N) : 0.0},
                        {"buffered", buffer.size()}, {"tool_calls", calls}, {"tool_ok", calls_ok},
                        {"grad_norm", us.grad_norm}, {"lr", lr}, {"seconds", step_s},
                        {"rollout_seconds", rs.seconds}, {"update_seconds", seconds_since(t_upd)},
                        {"decode_steps", rs.decode_steps}, {"generated_tokens", rs.tokens}};
    for (auto& [e, v] : len_by_effort) m["mean_length"][e] = v.first / double(v.second);
    for (auto& [e, v] : over_by_effort) m["over_budget"][e] = v.first / double(v.second);
    if (step % c.log_every == 0 || step == end) metrics.write(m);
    if (!o.quiet)
      std::fprintf(o.log, "rl step %lld/%lld reward %.3f correct %.3f kept %lld/%zu loss %.4f [%.1f s, rollout %.1f s]\n",
                   (long long)step, (long long)c.steps, res.last_reward, m["correct"].get<double>(), (long long)n_kept,
                   batch.size(), L, step_s, rs.seconds);
    if (c.eval_every > 0 && step % c.eval_every == 0) eval_now(step);
    if (step % c.checkpoint_every == 0 && step < end) save();
  }
  save();
  metrics.write({{"type", step == c.steps ? "end" : "stopped"}, {"step", step}});
  res.steps = step;
  return res;
}

}  // namespace k3
