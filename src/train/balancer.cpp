#include "train/balancer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "train/parallel.h"

namespace k3 {

double max_violation(const int64_t* loads, int64_t E) {
  double sum = 0, mx = 0;
  for (int64_t j = 0; j < E; ++j) { sum += double(loads[j]); mx = std::max(mx, double(loads[j])); }
  if (sum == 0) return 0;
  const double mean = sum / double(E);
  return (mx - mean) / mean;
}

void count_loads(int64_t* loads, const int32_t* topk_idx, int64_t m, int64_t k, int64_t E) {
  for (int64_t i = 0; i < m * k; ++i) {
    K3_ASSERT(topk_idx[i] >= 0 && topk_idx[i] < E);
    loads[topk_idx[i]]++;
  }
}

Balancer::Balancer(int64_t layers, int64_t E, int64_t k)
    : layers_(layers), E_(E), k_(k), loads_(size_t(layers), std::vector<int64_t>(size_t(E), 0)), last_loads_(loads_) {
  K3_ASSERT(k > 0 && k < E, "top-k must be below the expert count");
}

void Balancer::accumulate_loads(int64_t layer, const int32_t* topk_idx, int64_t m) {
  count_loads(loads_[layer].data(), topk_idx, m, k_, E_);
}

void Balancer::finish_step() {
  last_loads_ = loads_;
  for (auto& l : loads_) std::fill(l.begin(), l.end(), 0);
}

void Balancer::reduce_across(DataParallel& dp) {
  std::vector<int64_t> buf;
  buf.reserve(size_t(layers_ * E_));
  for (auto& l : loads_) buf.insert(buf.end(), l.begin(), l.end());
  dp.allreduce_sum_i64(buf.data(), int64_t(buf.size()), "balancer.loads");
  for (int64_t l = 0; l < layers_; ++l) std::copy(buf.begin() + l * E_, buf.begin() + (l + 1) * E_, loads_[l].begin());
}

// ---- Quantile Balancing ----

QuantileBalancer::QuantileBalancer(int64_t layers, int64_t E, int64_t k, QuantileBalancerOptions opt)
    : Balancer(layers, E, k), opt_(opt), per_expert_(size_t(layers), std::vector<std::vector<float>>(size_t(E))),
      hist_(size_t(layers)), lo_(size_t(layers), 0), hi_(size_t(layers), 0), count_(size_t(layers), 0) {
  if (!opt.exact && opt.bins < 2) fail("balancer: quantile histogram needs at least 2 bins");
}

void QuantileBalancer::ensure_range(int64_t layer, const float* bias) {
  if (count_[layer] > 0) return;  // range fixed for the whole step (bias does not change within it)
  float mn = bias[0], mx = bias[0];
  for (int64_t j = 1; j < E_; ++j) { mn = std::min(mn, bias[j]); mx = std::max(mx, bias[j]); }
  // Negated margins -r_ij = alpha_i - s_ij lie in (min(b) - 1, max(b) + 1) for s in (0, 1).
  lo_[layer] = double(mn) - 1.0;
  hi_[layer] = double(mx) + 1.0;
  hist_[layer].assign(size_t(E_ * opt_.bins), 0);
}

void QuantileBalancer::observe(int64_t layer, const float* s, const float* b, const int32_t* topk_idx, int64_t m) {
  K3_ASSERT(layer >= 0 && layer < layers_);
  accumulate_loads(layer, topk_idx, m);
  if (!opt_.exact) ensure_range(layer, b);
  std::vector<float> sb(static_cast<size_t>(E_));
  const double width = (hi_[layer] - lo_[layer]) / double(opt_.bins);
  for (int64_t i = 0; i < m; ++i) {
    const float* si = s + i * E_;
    for (int64_t j = 0; j < E_; ++j) sb[j] = si[j] + b[j];
    // alpha_i: the (k+1)-th largest biased score of token i.
    std::nth_element(sb.begin(), sb.begin() + k_, sb.end(), std::greater<float>());
    const float alpha = sb[k_];
    for (int64_t j = 0; j < E_; ++j) {
      const float neg_r = alpha - si[j];  // -r_ij
      if (opt_.exact) {
        per_expert_[layer][j].push_back(neg_r);
      } else {
        int64_t bin = int64_t(std::floor((double(neg_r) - lo_[layer]) / width));
        bin = std::clamp<int64_t>(bin, 0, opt_.bins - 1);
        hist_[layer][j * opt_.bins + bin]++;
      }
    }
  }
  count_[layer] += m;
}

double QuantileBalancer::next_bias_uncentred(int64_t layer, int64_t j) const {
  const int64_t m = count_[layer];
  K3_ASSERT(m > 0, "no tokens observed for this layer");
  // b_j = -quantile_{1-k/E}(r) = quantile_{k/E}(-r): linear interpolation between order
  // statistics at position q (m - 1), as numpy/torch 'linear'.
  const double q = double(k_) / double(E_);
  if (opt_.exact) {
    std::vector<float> v = per_expert_[layer][j];
    const double pos = q * double(m - 1);
    const int64_t lo = int64_t(std::floor(pos));
    const double frac = pos - double(lo);
    std::nth_element(v.begin(), v.begin() + lo, v.end());
    const double a = v[lo];
    if (frac == 0 || lo + 1 >= m) return a;
    const double bnext = *std::min_element(v.begin() + lo + 1, v.end());
    return a + frac * (bnext - a);
  }
  // Histogram: the value below which a fraction q of the mass lies, uniform within a bin.
  const int64_t* h = hist_[layer].data() + j * opt_.bins;
  const double width = (hi_[layer] - lo_[layer]) / double(opt_.bins);
  const double target = q * double(m);
  double acc = 0;
  for (int64_t bin = 0; bin < opt_.bins; ++bin) {
    if (acc + double(h[bin]) >= target && h[bin] > 0) {
      return lo_[layer] + width * (double(bin) + (target - acc) / double(h[bin]));
    }
    acc += double(h[bin]);
  }
  return hi_[layer];
}

void QuantileBalancer::update(const std::vector<float*>& biases) {
  K3_ASSERT(int64_t(biases.size()) == layers_);
  for (int64_t l = 0; l < layers_; ++l) {
    if (count_[l] == 0) continue;  // layer not seen this step: keep its bias
    std::vector<double> nb(static_cast<size_t>(E_));
    double mean = 0;
    for (int64_t j = 0; j < E_; ++j) mean += nb[j] = next_bias_uncentred(l, j);
    mean /= double(E_);
    for (int64_t j = 0; j < E_; ++j) biases[l][j] = float(nb[j] - mean);
    count_[l] = 0;
    for (auto& v : per_expert_[l]) v.clear();
  }
  finish_step();
}

// One all-reduce of int64: per layer [tokens observed | loads (E) | histogram (E x bins)]
// (the histogram part absent in exact mode, whose margins are gathered instead: per layer and
// expert the count, then the values, every rank's appended in rank order).
void QuantileBalancer::reduce_across(DataParallel& dp) {
  const int64_t hb = opt_.exact ? 0 : E_ * opt_.bins;
  std::vector<int64_t> buf;
  buf.reserve(size_t(layers_ * (1 + E_ + hb)));
  for (int64_t l = 0; l < layers_; ++l) {
    buf.push_back(count_[l]);
    buf.insert(buf.end(), loads_[l].begin(), loads_[l].end());
    if (hb) {
      if (hist_[l].size() != size_t(hb)) hist_[l].assign(size_t(hb), 0);
      buf.insert(buf.end(), hist_[l].begin(), hist_[l].end());
    }
  }
  dp.allreduce_sum_i64(buf.data(), int64_t(buf.size()), opt_.exact ? "balancer.loads" : "balancer.qb_histogram");
  size_t at = 0;
  for (int64_t l = 0; l < layers_; ++l) {
    count_[l] = buf[at++];
    std::copy(buf.begin() + int64_t(at), buf.begin() + int64_t(at) + E_, loads_[l].begin());
    at += size_t(E_);
    if (hb) {
      std::copy(buf.begin() + int64_t(at), buf.begin() + int64_t(at) + hb, hist_[l].begin());
      at += size_t(hb);
    }
  }
  if (!opt_.exact) return;
  std::vector<float> mine;
  for (int64_t l = 0; l < layers_; ++l)
    for (int64_t j = 0; j < E_; ++j) {
      const auto& v = per_expert_[l][j];
      const uint32_t n = uint32_t(v.size());
      float f;
      std::memcpy(&f, &n, sizeof f);  // counts travel as the bits of a float
      mine.push_back(f);
    }
  for (int64_t l = 0; l < layers_; ++l)
    for (int64_t j = 0; j < E_; ++j) mine.insert(mine.end(), per_expert_[l][j].begin(), per_expert_[l][j].end());
  std::vector<size_t> counts;
  const std::vector<float> all = dp.allgatherv(mine.data(), mine.size(), "balancer.qb_margins", &counts);
  for (auto& le : per_expert_)
    for (auto& v : le) v.clear();
  size_t base = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    size_t vals = base + size_t(layers_ * E_);
    for (int64_t l = 0; l < layers_; ++l)
      for (int64_t j = 0; j < E_; ++j) {
        uint32_t n;
        std::memcpy(&n, &all[base + size_t(l * E_ + j)], sizeof n);
        auto& v = per_expert_[l][j];
        v.insert(v.end(), all.begin() + int64_t(vals), all.begin() + int64_t(vals + n));
        vals += n;
      }
    base += counts[r];
  }
}

// ---- DeepSeek sign update ----

SignBalancer::SignBalancer(int64_t layers, int64_t E, int64_t k, double u) : Balancer(layers, E, k), u_(u) {}

void SignBalancer::observe(int64_t layer, const float*, const float*, const int32_t* topk_idx, int64_t m) {
  accumulate_loads(layer, topk_idx, m);
}

void SignBalancer::update(const std::vector<float*>& biases) {
  for (int64_t l = 0; l < layers_; ++l) {
    const auto& L = loads_[l];
    const double total = double(std::accumulate(L.begin(), L.end(), int64_t(0)));
    if (total == 0) continue;
    const double mean = total / double(E_);
    for (int64_t j = 0; j < E_; ++j) {
      const double d = mean - double(L[j]);
      biases[l][j] += float(u_ * double((d > 0) - (d < 0)));
    }
  }
  finish_step();
}

}  // namespace k3
