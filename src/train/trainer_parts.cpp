// Pieces of the training run that do not touch its loop (see trainer.h): the optimiser's
// parameter assignment, the sharded optimiser step and the end-of-run summary table.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "train/trainer.h"
#include "train/trainer_internal.h"

namespace k3 {

std::vector<ParamRef> optimizer_params(WeightStore& w, float* grads, bool muon) {
  const ParamLayout& lay = w.layout();
  const K3Config& c = w.config();
  K3_ASSERT(lay.experts() == ExpertStorage::Plain, "training needs plain (f32) routed experts");
  std::vector<ParamRef> out;
  out.reserve(lay.size());
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& s = lay.spec(i);
    if (s.name.ends_with("gate.e_score_correction_bias")) continue;  // the balancer's
    ParamRef p;
    p.name = s.name;
    p.w = w.param(i);
    p.g = grads + lay.offset(i);
    const bool vec = s.shape.size() == 1 || (s.shape.size() == 2 && s.shape[0] == 1);
    p.rows = vec ? 1 : s.shape[0];
    p.cols = vec ? s.numel() : s.numel() / s.shape[0];
    p.kind = OptKind::AdamW;
    p.decay = !vec;
    const bool matrix = s.shape.size() == 2 && !vec;
    const bool adamw_matrix = s.component == Component::Embedding || s.component == Component::LmHead ||
                              s.component == Component::Router;
    if (muon && matrix && !adamw_matrix) {
      p.kind = OptKind::Muon;
      if (s.component == Component::KDA &&
          (s.name.ends_with(".q_proj.weight") || s.name.ends_with(".k_proj.weight") || s.name.ends_with(".v_proj.weight")))
        p.heads = c.kda_num_heads;
      if (s.component == Component::MLA && (s.name.ends_with(".q_b_proj.weight") || s.name.ends_with(".kv_b_proj.weight")))
        p.heads = c.num_attention_heads;
    }
    out.push_back(std::move(p));
  }
  return out;
}

// ---- ShardedOptimizer ----

// Estimated work per parameter: AdamW ~ 12 flops per element; Muon per head block (r <= c
// after orientation) 5 Newton-Schulz iterations of Y Y^T, A A and B Y.
double optimizer_cost(const ParamRef& p) {
  const double n = double(p.rows * p.cols);
  if (p.kind != OptKind::Muon) return 12 * n;
  const double r0 = double(p.rows / p.heads), c0 = double(p.cols);
  const double r = std::min(r0, c0), cc = std::max(r0, c0);
  return 6 * n + double(p.heads) * 5 * (4 * r * r * cc + 2 * r * r * r) + 1e3 * double(p.heads);
}

std::vector<size_t> partition_params(const std::vector<ParamRef>& params, int parts) {
  K3_ASSERT(parts >= 1);
  std::vector<double> prefix(params.size() + 1, 0.0);
  for (size_t i = 0; i < params.size(); ++i) prefix[i + 1] = prefix[i] + optimizer_cost(params[i]);
  std::vector<size_t> cut(size_t(parts) + 1, params.size());
  cut[0] = 0;
  // Part r ends at the first parameter boundary whose running cost reaches (r + 1) / parts of
  // the total (nearest boundary), never before the previous cut.
  for (int r = 1; r < parts; ++r) {
    const double target = prefix.back() * double(r) / double(parts);
    size_t i = cut[size_t(r - 1)];
    while (i < params.size() && prefix[i + 1] <= target) ++i;
    if (i < params.size() && target - prefix[i] > prefix[i + 1] - target) ++i;  // nearer boundary
    cut[size_t(r)] = std::max(i, cut[size_t(r - 1)]);
  }
  return cut;
}

ShardedOptimizer::ShardedOptimizer(std::vector<ParamRef> params, const OptimizerOptions& o, int shards,
                                   const std::vector<double>& lr_scale) {
  K3_ASSERT(lr_scale.empty() || lr_scale.size() == params.size(), "one lr scale per parameter");
  auto scale = [&](size_t i) { return lr_scale.empty() ? 1.0 : lr_scale[i]; };
  std::vector<double> cost(params.size());
  double total = 0;
  for (size_t i = 0; i < params.size(); ++i) total += cost[i] = optimizer_cost(params[i]);
  // Cut where the running cost passes the next multiple of total / shards, and wherever the
  // lr scale changes.
  const double chunk = total / double(std::max(1, shards));
  size_t begin = 0;
  double acc = 0;
  while (begin < params.size()) {
    const double target = (std::floor(acc / chunk + 1e-9) + 1) * chunk;
    size_t end = begin;
    while (end < params.size() &&
           (end == begin || (acc + cost[end] <= target * (1 + 1e-9) && scale(end) == scale(begin))))
      acc += cost[end++];
    std::vector<ParamRef> part(params.begin() + int64_t(begin), params.begin() + int64_t(end));
    shards_.push_back(std::make_unique<Optimizer>(std::move(part), o));
    shard_scale_.push_back(scale(begin));
    begin = end;
  }
  params_ = std::move(params);
}

void ShardedOptimizer::step(double lr) {
  // Each parameter's update depends on nothing but its own gradient and moments, so the
  // result does not depend on which thread runs which shard (BLAS inside a parallel region
  // runs single-threaded).
  const int64_t n = int64_t(shards_.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t s = 0; s < n; ++s) shards_[size_t(s)]->step(lr * shard_scale_[size_t(s)]);
  ++t_;
}

int64_t ShardedOptimizer::steps() const { return t_; }

void ShardedOptimizer::set_steps(int64_t t) {
  t_ = t;
  for (auto& s : shards_) s->set_steps(t);
}

int64_t ShardedOptimizer::state_elements() const {
  int64_t n = 0;
  for (auto& s : shards_) n += 2 * s->total_elements();
  return n;
}

// Shards hold consecutive parameter ranges and each lays its moments out per parameter
// ([m | v] at 2 * offset), so concatenating the shards gives the layout of one Optimizer
// over all parameters: checkpoints do not depend on the shard count.
void ShardedOptimizer::get_state(std::vector<float>& out) {
  out.clear();
  out.reserve(size_t(state_elements()));
  for (auto& s : shards_) out.insert(out.end(), s->state().begin(), s->state().end());
}

void ShardedOptimizer::set_state(const std::vector<float>& in) {
  K3_ASSERT(int64_t(in.size()) == state_elements(), "optimizer state size");
  size_t at = 0;
  for (auto& s : shards_) {
    std::copy(in.begin() + int64_t(at), in.begin() + int64_t(at + s->state().size()), s->state().begin());
    at += s->state().size();
  }
}

// ---- Summary ----

std::string format_summary(const TrainResult& r) {
  std::string out;
  char buf[512];
  out += "\nsummary (" + std::string(r.complete ? "complete" : "incomplete") + ", " + std::to_string(r.steps) + "/" +
         std::to_string(r.total_steps) + " steps, " + std::to_string(r.tokens_seen) + " tokens, training time " +
         format_duration(r.train_seconds) + ")\n";
  std::snprintf(buf, sizeof buf, "%-10s %8s %7s %10s %9s %13s %15s\n", "stage", "seq_len", "steps", "tokens", "tok/s",
                "held-out loss", "held-out bits/B");
  out += buf;
  for (const StageSummary& s : r.stages) {
    const double tps = s.train_seconds > 0 ? double(s.tokens) / s.train_seconds : 0;
    if (s.evaluated)
      std::snprintf(buf, sizeof buf, "%-10s %8lld %7lld %10lld %9.0f %13.4f %15.4f\n", s.name.c_str(),
                    (long long)s.seq_len, (long long)s.steps_done, (long long)s.tokens, tps, s.eval_loss, s.eval_bpb);
    else
      std::snprintf(buf, sizeof buf, "%-10s %8lld %7lld %10lld %9.0f %13s %15s\n", s.name.c_str(), (long long)s.seq_len,
                    (long long)s.steps_done, (long long)s.tokens, tps, "-", "-");
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "unigram baseline (train byte frequencies on held-out bytes): %.4f bits/byte\n",
                r.unigram_bpb);
  out += buf;
  const StageSummary* last = nullptr;
  for (const StageSummary& s : r.stages)
    if (s.evaluated) last = &s;
  if (last && !last->eval_maxvio.empty()) {
    out += "held-out MaxVio per MoE layer (after stage " + last->name + "):";
    for (double v : last->eval_maxvio) {
      std::snprintf(buf, sizeof buf, " %.3f", v);
      out += buf;
    }
    out += "\n";
  }
  if (r.train_seconds > 0) {
    std::snprintf(buf, sizeof buf, "overall training throughput: %.0f tokens/s\n", double(r.tokens_seen) / r.train_seconds);
    out += buf;
  }
  return out;
}

}  // namespace k3
