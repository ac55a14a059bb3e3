#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace k3 {

Sampler::Sampler(const SamplerOptions& opt) : opt_(opt), state_(opt.seed) {
  if (!(opt.temperature >= 0)) fail("sampling: temperature must be >= 0");
  if (opt.top_k < 0) fail("sampling: top-k must be >= 0");
  if (!(opt.top_p > 0 && opt.top_p <= 1)) fail("sampling: top-p must be in (0, 1]");
}

double Sampler::next_uniform() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  K3_ASSERT(vocab > 0);
  if (opt_.temperature == 0.0) {  // greedy; lowest index wins ties
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
  idx_.resize(size_t(vocab));
  std::iota(idx_.begin(), idx_.end(), 0);
  // Sort candidates by logit (descending, index ascending on ties) for top-k / top-p.
  int64_t n = vocab;
  if (opt_.top_k > 0 && opt_.top_k < n) n = opt_.top_k;
  auto cmp = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx_.begin(), idx_.begin() + n, idx_.end(), cmp);
  prob_.resize(size_t(n));
  const double mx = logits[idx_[0]];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob_[i] = std::exp((double(logits[idx_[i]]) - mx) / opt_.temperature);
  if (opt_.top_p < 1.0) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      acc += prob_[i] / sum;
      if (acc >= opt_.top_p) { keep = i + 1; break; }
    }
    n = keep;
    sum = std::accumulate(prob_.begin(), prob_.begin() + n, 0.0);
  }
  double r = next_uniform() * sum;
  int64_t last = 0;  // the last candidate with mass: rounding can leave r unspent, and a
                     // masked (-inf, probability 0) candidate must never be returned
  for (int64_t i = 0; i < n; ++i) {
    if (prob_[i] > 0) last = i;
    r -= prob_[i];
    if (r < 0 && prob_[i] > 0) return idx_[i];
  }
  return idx_[last];
}

}  // namespace k3
