// Random initialisation (see init.h for the recipes and their sources).
#include "model/init.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace k3 {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): the stream every draw comes from.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }          // [0, 1)
  double uniform_open0() { return double((next() >> 11) + 1) * (1.0 / 9007199254740992.0); }  // (0, 1]
};

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The stream of one tensor: seed and name mixed, so tensors are independent of table order.
SplitMix64 stream_for(uint64_t seed, const std::string& name) {
  SplitMix64 a{seed};
  return SplitMix64{a.next() ^ fnv1a64(name)};
}

// n normals N(0, std^2) by Box-Muller, two per pair of uniforms.
void fill_normal(float* dst, int64_t n, SplitMix64& rng, double std) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(rng.uniform_open0()));
    const double th = kTwoPi * rng.uniform();
    dst[i] = float(std * r * std::cos(th));
    if (i + 1 < n) dst[i + 1] = float(std * r * std::sin(th));
  }
}

}  // namespace

const char* init_rule_name(InitRule r) {
  switch (r) {
    case InitRule::Zeros: return "zeros";
    case InitRule::Ones: return "ones";
    case InitRule::ALog: return "a_log";
    case InitRule::DtBias: return "dt_bias";
    case InitRule::ConvUniform: return "conv_uniform";
    case InitRule::Normal: return "normal";
    case InitRule::ScaledNormal: return "scaled_normal";
  }
  return "?";
}

InitRule init_rule(const ParamSpec& s) {
  const std::string& n = s.name;
  if (n.ends_with("_res_proj.weight") || n.ends_with("e_score_correction_bias")) return InitRule::Zeros;
  if (n.ends_with(".A_log")) return InitRule::ALog;
  if (n.ends_with(".dt_bias")) return InitRule::DtBias;
  if (n.ends_with("_conv1d.weight")) return InitRule::ConvUniform;
  if (s.shape.size() == 1) return InitRule::Ones;  // every other vector is an RMSNorm gain
  if (n.ends_with("self_attn.o_proj.weight") || n.ends_with("mlp.down_proj.weight") ||
      n.ends_with("shared_experts.down_proj.weight") || n.ends_with("routed_expert_up_proj.weight") ||
      (s.component == Component::RoutedExperts && n.ends_with(".w2.weight")))
    return InitRule::ScaledNormal;
  return InitRule::Normal;
}

void init_tensor(float* dst, int64_t n, const ParamSpec& spec, InitRule rule, uint64_t seed, double std,
                 int64_t num_layers) {
  SplitMix64 rng = stream_for(seed, spec.name);
  switch (rule) {
    case InitRule::Zeros:
      for (int64_t i = 0; i < n; ++i) dst[i] = 0.f;
      break;
    case InitRule::Ones:
      for (int64_t i = 0; i < n; ++i) dst[i] = 1.f;
      break;
    case InitRule::ALog:  // A ~ U(1, 16) per head, stored as log A
      for (int64_t i = 0; i < n; ++i) dst[i] = float(std::log(1.0 + 15.0 * rng.uniform()));
      break;
    case InitRule::DtBias: {  // dt log-uniform in [1e-3, 1e-1], floor 1e-4; dt_bias = dt + log(-expm1(-dt))
      const double lo = std::log(1e-3), hi = std::log(1e-1);
      for (int64_t i = 0; i < n; ++i) {
        const double dt = std::max(std::exp(lo + (hi - lo) * rng.uniform()), 1e-4);
        dst[i] = float(dt + std::log(-std::expm1(-dt)));
      }
      break;
    }
    case InitRule::ConvUniform: {
      K3_ASSERT(spec.shape.size() == 3, "conv weight is not [C, 1, K]: " + spec.name);
      const double bound = 1.0 / std::sqrt(double(spec.shape[2]));
      for (int64_t i = 0; i < n; ++i) dst[i] = float(bound * (2.0 * rng.uniform() - 1.0));
      break;
    }
    case InitRule::Normal:
      fill_normal(dst, n, rng, std);
      break;
    case InitRule::ScaledNormal:
      fill_normal(dst, n, rng, std / std::sqrt(2.0 * double(std::max<int64_t>(num_layers, 1))));
      break;
  }
}

WeightStore init_weights(const K3Config& cfg, const InitOptions& opt,
                         const std::function<void(int64_t, int64_t)>& progress) {
  WeightStore w(cfg, opt.experts);
  const ParamLayout& lay = w.layout();
  const std::vector<ParamSpec>& specs = lay.specs();
  if (opt.experts == ExpertStorage::Mxfp4)
    for (const ParamSpec& s : specs)
      if (s.component == Component::RoutedExperts) stored_tensors(s, ExpertStorage::Mxfp4);  // throws on a bad width
  int64_t total = 0;
  for (const ParamSpec& s : specs) total += s.numel();

  // Specs come grouped: globals, then layer by layer, then globals; one group at a time,
  // tensors of a group in parallel.
  int64_t done = 0;
  for (size_t g0 = 0; g0 < specs.size();) {
    size_t g1 = g0 + 1;
    while (g1 < specs.size() && specs[g1].layer == specs[g0].layer) ++g1;
    std::vector<int64_t> group_done(g1 - g0, 0);
#pragma omp parallel
    {
      std::vector<float> tmp;
#pragma omp for schedule(dynamic)
      for (size_t i = g0; i < g1; ++i) {
        const ParamSpec& s = specs[i];
        const InitRule rule = init_rule(s);
        if (s.component == Component::RoutedExperts && opt.keep_expert && !opt.keep_expert(s.expert)) {
          // another rank's expert: left zero (untouched)
        } else if (lay.in_buffer(i)) {
          init_tensor(w.param(i), s.numel(), s, rule, opt.seed, opt.std, cfg.num_hidden_layers);
        } else {  // MXFP4-held routed expert: draw in f32, quantise
          tmp.resize(size_t(s.numel()));
          init_tensor(tmp.data(), s.numel(), s, rule, opt.seed, opt.std, cfg.num_hidden_layers);
          w.set_mxfp4(i, Mxfp4Matrix::quantize(Tensor::from_f32(s.shape, tmp.data())));
        }
        group_done[i - g0] = s.numel();
      }
    }
    for (int64_t n : group_done) done += n;
    if (progress) progress(done, total);
    g0 = g1;
  }
  return w;
}

}  // namespace k3
