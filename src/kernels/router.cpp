// Sigmoid top-k router, its backward and the Switch-style auxiliary loss (see router.h).
#include "kernels/router.h"

#include <cmath>
#include <limits>
#include <vector>

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
void router_forward(int32_t* topk_idx, T* topk_w, T* scores, const T* x, const MatT<T>& W_r, const T* bias, int64_t Tn,
                    int64_t d, int64_t E, int64_t k, bool renorm, double scale) {
  linear(scores, x, W_r, Tn, d, E);
#pragma omp parallel for schedule(static) if (Tn * E > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    T* s = scores + t * E;
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(s[e]);
    int32_t* idx = topk_idx + t * k;
    router_select_topk(idx, s, bias, E, k);
    // Mixture weights from the UNBIASED scores (docs/model.md section 5).
    T sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += s[idx[i]];
    const T mul = renorm ? T(scale) / (sum + T(1e-20)) : T(scale);
    for (int64_t i = 0; i < k; ++i) topk_w[t * k + i] = s[idx[i]] * mul;
  }
}

template <typename T>
void router_backward(T* dx, T* dW_r, T* dlogits, const T* dtopk_w, const T* dscores, const int32_t* topk_idx,
                     const T* scores, const T* x, const T* W_r, int64_t Tn, int64_t d, int64_t E, int64_t k,
                     bool renorm, double scale) {
#pragma omp parallel for schedule(static) if (Tn * E > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    const T* s = scores + t * E;
    const int32_t* idx = topk_idx + t * k;
    const T* dw = dtopk_w + t * k;
    T* dl = dlogits + t * E;
    // dl holds d scores first: the auxiliary hook for every expert, then the selected ones.
    for (int64_t e = 0; e < E; ++e) dl[e] = dscores ? dscores[t * E + e] : T(0);
    if (renorm) {
      // Forward: w_i = s[idx_i] * scale / (sum + 1e-20).
      T sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += s[idx[i]];
      const T Z = sum + T(1e-20), mul = T(scale) / Z;
      T dot = 0;  // sum_i dw_i w_i
      for (int64_t i = 0; i < k; ++i) dot += dw[i] * s[idx[i]] * mul;
      for (int64_t i = 0; i < k; ++i) dl[idx[i]] += (T(scale) * dw[i] - dot) / Z;
    } else {
      for (int64_t i = 0; i < k; ++i) dl[idx[i]] += T(scale) * dw[i];
    }
    // Forward: s = sigmoid(logit).
    for (int64_t e = 0; e < E; ++e) dl[e] *= s[e] * (T(1) - s[e]);
  }
  // Forward: logits = x W_r^T.
  gemm(true, false, E, d, Tn, T(1), dlogits, E, x, d, T(1), dW_r, d);
  gemm(false, false, Tn, d, E, T(1), dlogits, E, W_r, d, T(1), dx, d);
}

template <typename T>
double router_aux_loss(T* dscores, const int32_t* topk_idx, const T* scores, int64_t Tn, int64_t E, int64_t k,
                       double alpha) {
  if (Tn == 0) return 0.0;
  std::vector<double> f(size_t(E), 0.0), P(size_t(E), 0.0);
  for (int64_t a = 0; a < Tn * k; ++a) {
    K3_ASSERT(topk_idx[a] >= 0 && topk_idx[a] < E, "router_aux_loss: expert index out of range");
    f[size_t(topk_idx[a])] += 1.0 / double(Tn * k);
  }
  for (int64_t t = 0; t < Tn; ++t) {
    const T* s = scores + t * E;
    double Z = 0, fn = 0;
    for (int64_t e = 0; e < E; ++e) Z += double(s[e]);
    for (int64_t e = 0; e < E; ++e) {
      P[size_t(e)] += double(s[e]) / Z / double(Tn);
      fn += f[size_t(e)] * double(s[e]) / Z;
    }
    if (dscores) {
      const double c = alpha * double(E) / (double(Tn) * Z);
      for (int64_t e = 0; e < E; ++e) dscores[t * E + e] = T(c * (f[size_t(e)] - fn));
    }
  }
  double L = 0;
  for (int64_t e = 0; e < E; ++e) L += f[size_t(e)] * P[size_t(e)];
  return alpha * double(E) * L;
}

template void router_backward<float>(float*, float*, float*, const float*, const float*, const int32_t*,
                                     const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                     bool, double);
template void router_backward<double>(double*, double*, double*, const double*, const double*, const int32_t*,
                                      const double*, const double*, const double*, int64_t, int64_t, int64_t,
                                      int64_t, bool, double);
template double router_aux_loss<float>(float*, const int32_t*, const float*, int64_t, int64_t, int64_t, double);
template double router_aux_loss<double>(double*, const int32_t*, const double*, int64_t, int64_t, int64_t, double);
template void router_select_topk<float>(int32_t*, const float*, const float*, int64_t, int64_t);
template void router_select_topk<double>(int32_t*, const double*, const double*, int64_t, int64_t);
template void router_forward<float>(int32_t*, float*, float*, const float*, const Mat&, const float*, int64_t,
                                    int64_t, int64_t, int64_t, bool, double);
template void router_forward<double>(int32_t*, double*, double*, const double*, const MatT<double>&, const double*,
                                     int64_t, int64_t, int64_t, int64_t, bool, double);

}  // namespace k3
