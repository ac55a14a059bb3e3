// Sigmoid top-k router (see router.h).
#include "kernels/router.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"

namespace k3 {

template <typename T>
void router_select_topk(int32_t* idx, const T* s, const T* bias, int64_t E, int64_t k) {
  K3_ASSERT(k > 0 && k <= E, "router: top_k must lie in [1, n_experts]");
  // Insertion into idx[0..k) kept sorted best-first. The comparison is a strict `>`, so of
  // two equal keys the earlier (lower) expert index stays ahead. O(E k); k is 16 for K3.
  constexpr T lowest = -std::numeric_limits<T>::infinity();
  auto key = [&](int64_t e) {
    const T v = s[e] + (bias ? bias[e] : T(0));
    return std::isnan(v) ? lowest : v;
  };
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    const T v = key(e);
    if (n == k && !(v > key(idx[k - 1]))) continue;
    int64_t pos = n < k ? n++ : k - 1;
    for (; pos > 0 && v > key(idx[pos - 1]); --pos) idx[pos] = idx[pos - 1];
    idx[pos] = int32_t(e);
  }
}

template <typename T>
void router_forward(int32_t* topk_idx, T* topk_w, T* scores, const T* x, const T* W_r, const T* bias, int64_t Tn,
                    int64_t d, int64_t E, int64_t k, bool renorm, double scale) {
  linear(scores, x, W_r, Tn, d, E);
#pragma omp parallel for schedule(static) if (Tn * E > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    T* s = scores + t * E;
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(s[e]);
    int32_t* idx = topk_idx + t * k;
    router_select_topk(idx, s, bias, E, k);
    // Mixture weights from the UNBIASED scores (K3_REFERENCE section 5).
    T sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += s[idx[i]];
    const T mul = renorm ? T(scale) / (sum + T(1e-20)) : T(scale);
    for (int64_t i = 0; i < k; ++i) topk_w[t * k + i] = s[idx[i]] * mul;
  }
}

template void router_select_topk<float>(int32_t*, const float*, const float*, int64_t, int64_t);
template void router_select_topk<double>(int32_t*, const double*, const double*, int64_t, int64_t);
template void router_forward<float>(int32_t*, float*, float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t, int64_t, bool, double);
template void router_forward<double>(int32_t*, double*, double*, const double*, const double*, const double*,
                                     int64_t, int64_t, int64_t, int64_t, bool, double);

}  // namespace k3
