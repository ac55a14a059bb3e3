// Moving Quantile Balancing (see moving_qb.h).
#include "train/moving_qb.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "kernels/router.h"

namespace k3 {

namespace {

void check(int64_t T, int64_t E, int64_t k, const MovingQBOptions& o) {
  K3_ASSERT(T >= 0 && k > 0 && k < E, "moving QB: need 0 < k < E");
  K3_ASSERT(o.lambda > 0 && o.lambda < 1 && o.chunk > 0 && o.bins >= 2, "moving QB: lambda in (0, 1), chunk > 0, bins >= 2");
}

// Routes tokens [t0, t1) with the bias in force and hands each token's negated margins
// -r_tj = alpha_t - s_tj to `sample(j, value)`.
template <typename F>
void route_chunk(int32_t* idx, const float* s, int64_t t0, int64_t t1, int64_t E, int64_t k, MovingQBScratch& ws,
                 F&& sample) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* st = s + t * E;
    router_select_topk(idx + t * k, st, ws.bias.data(), E, k);
    // alpha_t: the (k+1)-th largest biased score (docs/model.md section 6).
    for (int64_t j = 0; j < E; ++j) ws.sb[size_t(j)] = st[j] + ws.bias[size_t(j)];
    std::nth_element(ws.sb.begin(), ws.sb.begin() + k, ws.sb.end(), std::greater<float>());
    const float alpha = ws.sb[size_t(k)];
    for (int64_t j = 0; j < E; ++j) sample(j, alpha - st[j]);
  }
}

void centre_into_bias(MovingQBScratch& ws, int64_t E) {
  double mean = 0;
  for (int64_t j = 0; j < E; ++j) mean += ws.next[size_t(j)];
  mean /= double(E);
  for (int64_t j = 0; j < E; ++j) ws.bias[size_t(j)] = float(ws.next[size_t(j)] - mean);
}

void init(MovingQBScratch& ws, const float* b, int64_t E) {
  ws.bias.assign(b, b + E);
  ws.sb.resize(size_t(E));
  ws.next.resize(size_t(E));
}

}  // namespace

void moving_qb_route(int32_t* idx, const float* s, const float* b, int64_t T, int64_t E, int64_t k,
                     const MovingQBOptions& opt, MovingQBScratch& ws) {
  check(T, E, k, opt);
  init(ws, b, E);
  const int64_t B = opt.bins;
  ws.hist.assign(size_t(E * B), 0.0);
  float mn = b[0], mx = b[0];
  for (int64_t j = 1; j < E; ++j) mn = std::min(mn, b[j]), mx = std::max(mx, b[j]);
  const double lo = double(mn) - 1.0, hi = double(mx) + 1.0, width = (hi - lo) / double(B);
  const double q = double(k) / double(E);
  // H_n = (1 - lambda) H_(n-1) + lambda h_n is kept as G_n = H_n / (1 - lambda)^n: chunk n
  // adds its counts with weight w_n = lambda / (1 - lambda)^n (w_0 = 1) and nothing decays;
  // quantiles do not depend on the common scale. G is rescaled before w could overflow.
  double w = 1.0, total = 0.0;
  for (int64_t t0 = 0, n = 0; t0 < T; t0 += opt.chunk, ++n) {
    const int64_t t1 = std::min(T, t0 + opt.chunk);
    if (n == 1) w = opt.lambda / (1.0 - opt.lambda);
    if (n > 1) w /= 1.0 - opt.lambda;
    if (w > 1e200) {
      for (double& h : ws.hist) h /= w;
      total /= w, w = 1.0;
    }
    route_chunk(idx, s, t0, t1, E, k, ws, [&](int64_t j, float v) {
      const int64_t bin = std::clamp<int64_t>(int64_t(std::floor((double(v) - lo) / width)), 0, B - 1);
      ws.hist[size_t(j * B + bin)] += w;
    });
    total += w * double(t1 - t0);
    if (t1 == T) break;
    // The next chunk's bias: quantile_(k/E) of each expert's EMA histogram (uniform within a bin).
    const double target = q * total;
    for (int64_t j = 0; j < E; ++j) {
      const double* h = ws.hist.data() + j * B;
      double acc = 0, v = hi;
      for (int64_t bin = 0; bin < B; ++bin) {
        if (h[bin] > 0 && acc + h[bin] >= target) {
          v = lo + width * (double(bin) + (target - acc) / h[bin]);
          break;
        }
        acc += h[bin];
      }
      ws.next[size_t(j)] = v;
    }
    centre_into_bias(ws, E);
  }
}

void moving_qb_route_ref(int32_t* idx, const float* s, const float* b, int64_t T, int64_t E, int64_t k,
                         const MovingQBOptions& opt, MovingQBScratch& ws) {
  check(T, E, k, opt);
  init(ws, b, E);
  ws.samples.assign(size_t(E), {});
  const double q = double(k) / double(E);
  for (int64_t t0 = 0, n = 0; t0 < T; t0 += opt.chunk, ++n) {
    const int64_t t1 = std::min(T, t0 + opt.chunk);
    // H_n = (1 - lambda) H_(n-1) + lambda h_n, H_0 = h_0: old samples decay, new ones weigh lambda.
    if (n > 0)
      for (auto& v : ws.samples)
        for (auto& p : v) p.second *= 1.0 - opt.lambda;
    const double wn = n == 0 ? 1.0 : opt.lambda;
    route_chunk(idx, s, t0, t1, E, k, ws, [&](int64_t j, float v) { ws.samples[size_t(j)].push_back({v, wn}); });
    if (t1 == T) break;
    for (int64_t j = 0; j < E; ++j) {
      auto& v = ws.samples[size_t(j)];
      std::sort(v.begin(), v.end());
      double W = 0;
      for (auto& p : v) W += p.second;
      // Exact weighted quantile: the smallest value whose cumulative weight reaches q W.
      double acc = 0, val = v.back().first;
      for (auto& p : v) {
        acc += p.second;
        if (acc >= q * W) {
          val = p.first;
          break;
        }
      }
      ws.next[size_t(j)] = val;
    }
    centre_into_bias(ws, E);
  }
}

}  // namespace k3
