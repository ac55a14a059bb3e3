// Log-sum-exp over one row of V logits: the softmax normaliser behind the training
// cross-entropy (train/model_grad), the held-out loss (train/trainer, train/routing_eval) and
// the post-training token log-probabilities and sampling (posttrain/token_grad, rollout):
//   lse(x) = m + log sum_v e^(x_v - m),   m = max_v x_v         (no term above 1: no overflow)
// log_sum_exp_parts gives m and the sum; log_sum_exp the value. The terms are formed in the
// row's precision T (float rows: one float exp per logit, the fast path; double rows: exact
// double) and summed in double in index order, so a row's value is deterministic and a sampler
// walking the same terms (exp_term) reaches the same sum. log_sum_exp_ref is the plain
// reference, every difference and exp in double; for double rows the two are the same
// arithmetic. tests/kernels/test_log_sum_exp.cpp compares them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace k3 {

template <typename T>
struct LogSumExpParts {
  T max;       // m = max_v x_v (the first maximum)
  double sum;  // sum_v e^(x_v - m), each term as exp_term forms it
  double value() const { return double(max) + std::log(sum); }
};

// One term e^(x - m), formed in T and widened.
template <typename T>
inline double exp_term(T x, T max) {
  return double(std::exp(x - max));
}

template <typename T>
LogSumExpParts<T> log_sum_exp_parts(const T* x, int64_t V) {
  K3_ASSERT(V > 0, "log_sum_exp: an empty row");
  const T mx = *std::max_element(x, x + V);
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += exp_term(x[v], mx);
  return {mx, z};
}

template <typename T>
double log_sum_exp(const T* x, int64_t V) {
  return log_sum_exp_parts(x, V).value();
}

template <typename T>
double log_sum_exp_ref(const T* x, int64_t V) {
  K3_ASSERT(V > 0, "log_sum_exp: an empty row");
  double mx = double(x[0]);
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(x[v]));
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(double(x[v]) - mx);
  return mx + std::log(z);
}

}  // namespace k3
