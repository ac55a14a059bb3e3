// The RL objectives on per-token log-probabilities (see policy_loss.h for the formulas).
#include "posttrain/policy_loss.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace k3 {

void group_advantages(const std::vector<LossSample>& s, bool std_norm, std::vector<double>& adv,
                      std::vector<uint8_t>& keep) {
  struct Acc {
    double sum = 0, sq = 0, n = 0, lo = 1e300, hi = -1e300;
  };
  std::map<int64_t, Acc> g;
  for (const LossSample& x : s) {
    Acc& a = g[x.group];
    a.sum += x.reward, a.sq += x.reward * x.reward, a.n += 1;
    a.lo = std::min(a.lo, x.reward), a.hi = std::max(a.hi, x.reward);
  }
  adv.assign(s.size(), 0.0);
  keep.assign(s.size(), 0);
  for (size_t i = 0; i < s.size(); ++i) {
    const Acc& a = g[s[i].group];
    if (a.n < 2 || a.hi == a.lo) continue;  // zero reward variance: no signal (DAPO dynamic sampling)
    const double mean = a.sum / a.n;
    double A = s[i].reward - mean;
    if (std_norm) A /= std::sqrt(std::max(a.sq / a.n - mean * mean, 0.0)) + 1e-6;
    adv[i] = A;
    keep[i] = 1;
  }
}

double sample_policy_loss(const LossSample& x, double A, int64_t N, int64_t n_samples, const PolicyLossOptions& o,
                          std::vector<double>& dl, PolicyLossResult& r, double& ratio_sum, double& kl_sum) {
  dl.assign(x.logp.size(), 0.0);
  double loss = 0;
  if (o.kind == RLLossKind::dapo) {
    for (size_t t = 0; t < x.logp.size(); ++t) {
      if (!x.mask[t]) continue;
      const double rho = std::exp(x.logp[t] - x.behav_logp[t]);
      ratio_sum += rho;
      // min(rho A, clip(rho) A): the unclipped branch is the minimum (and carries the
      // gradient) when A > 0 and rho <= 1 + eps_high, or A < 0 and rho >= 1 - eps_low.
      const double clipped = std::clamp(rho, 1.0 - o.clip_low, 1.0 + o.clip_high);
      const bool live = (A >= 0 ? rho <= 1.0 + o.clip_high : rho >= 1.0 - o.clip_low) && rho <= o.is_cap;
      const double obj = live ? rho * A : std::min(rho * A, clipped * A);
      loss -= obj / double(N);
      if (live) dl[t] = -A * rho / double(N);
      else r.clipped++;
      if (o.kl_coef > 0) {
        const double d = x.ref_logp[t] - x.logp[t];
        const double kl = std::exp(d) - d - 1.0;
        kl_sum += kl;
        loss += o.kl_coef * kl / double(N);
        dl[t] += o.kl_coef * (1.0 - std::exp(d)) / double(N);
      }
    }
  } else {
    double delta = 0;
    for (size_t t = 0; t < x.logp.size(); ++t) {
      if (!x.mask[t]) continue;
      delta += x.logp[t] - x.behav_logp[t];
      ratio_sum += std::exp(x.logp[t] - x.behav_logp[t]);
    }
    // r_i - mean r is the (un-normalised) group advantage A.
    const double e = A - o.tau * delta;
    loss += e * e / double(n_samples);
    const double g = -2.0 * o.tau * e / double(n_samples);
    for (size_t t = 0; t < x.logp.size(); ++t)
      if (x.mask[t]) dl[t] = g;
  }
  return loss;
}

PolicyLossResult policy_loss(const std::vector<LossSample>& s, const PolicyLossOptions& o,
                             std::vector<std::vector<double>>& dlogp) {
  PolicyLossResult r;
  group_advantages(s, o.kind == RLLossKind::dapo && o.std_norm, r.advantage, r.keep);
  dlogp.resize(s.size());
  int64_t N = 0, n_samples = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    K3_ASSERT(s[i].behav_logp.size() == s[i].logp.size() && s[i].mask.size() == s[i].logp.size(),
              "policy_loss: per-token arrays differ in length");
    K3_ASSERT(o.kl_coef == 0 || s[i].ref_logp.size() == s[i].logp.size(), "policy_loss: reference logprobs missing");
    dlogp[i].assign(s[i].logp.size(), 0.0);
    if (!r.keep[i]) {
      r.dropped++;
      continue;
    }
    r.kept++, n_samples++;
    for (uint8_t m : s[i].mask) N += m ? 1 : 0;
  }
  r.tokens = N;
  if (r.kept == 0 || N == 0) return r;
  double ratio_sum = 0, kl_sum = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (r.keep[i]) r.loss += sample_policy_loss(s[i], r.advantage[i], N, n_samples, o, dlogp[i], r, ratio_sum, kl_sum);
  r.mean_ratio = ratio_sum / double(N);
  r.kl = kl_sum / double(N);
  return r;
}

RLLossKind parse_rl_loss(const std::string& name, const std::string& file) {
  if (name == "dapo") return RLLossKind::dapo;
  if (name == "mirror") return RLLossKind::mirror;
  fail_input(file, "loss", "'" + name + "' is not one of dapo, mirror");
}

const char* rl_loss_name(RLLossKind k) { return k == RLLossKind::dapo ? "dapo" : "mirror"; }

}  // namespace k3
