// Block-diagonal bidirectional attention (see segment_attention.h).
#include "kernels/segment_attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/gemm.h"

namespace k3 {

namespace {

// p [n, n] (row i: query i) = softmax of scale * Q K^T for one segment and head.
template <typename T>
void segment_probs_ref(std::vector<T>& p, const T* q, const T* k, int64_t n, const SegmentAttnDims& d) {
  p.assign(size_t(n * n), T(0));
  for (int64_t i = 0; i < n; ++i) {
    T mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      T s = 0;
      for (int64_t c = 0; c < d.hd; ++c) s += q[i * d.ld_in + c] * k[j * d.ld_in + c];
      p[size_t(i * n + j)] = s * T(d.scale);
      mx = std::max(mx, p[size_t(i * n + j)]);
    }
    T z = 0;
    for (int64_t j = 0; j < n; ++j) z += (p[size_t(i * n + j)] = std::exp(p[size_t(i * n + j)] - mx));
    for (int64_t j = 0; j < n; ++j) p[size_t(i * n + j)] /= z;
  }
}

void check(const std::vector<int64_t>& cu, const SegmentAttnDims& d) {
  K3_ASSERT(cu.size() >= 1 && cu[0] == 0 && d.hd > 0 && d.H > 0 && d.ld_in >= 3 * d.H * d.hd);
  for (size_t s = 1; s < cu.size(); ++s) K3_ASSERT(cu[s] >= cu[s - 1]);
}

// Row softmax of s [n, n] in place.
template <typename T>
void softmax_rows(T* s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T* r = s + i * n;
    const T mx = *std::max_element(r, r + n);
    T z = 0;
    for (int64_t j = 0; j < n; ++j) z += (r[j] = std::exp(r[j] - mx));
    const T iz = T(1) / z;
    for (int64_t j = 0; j < n; ++j) r[j] *= iz;
  }
}

}  // namespace

template <typename T>
void segment_attention_forward_ref(T* o, const T* q, const T* k, const T* v, const std::vector<int64_t>& cu,
                                   const SegmentAttnDims& d) {
  check(cu, d);
  const int64_t Q = d.H * d.hd;
  std::vector<T> p;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t t0 = cu[s], n = cu[s + 1] - cu[s];
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t c0 = h * d.hd;
      segment_probs_ref(p, q + t0 * d.ld_in + c0, k + t0 * d.ld_in + c0, n, d);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d.hd; ++c) {
          T acc = 0;
          for (int64_t j = 0; j < n; ++j) acc += p[size_t(i * n + j)] * v[(t0 + j) * d.ld_in + c0 + c];
          o[(t0 + i) * Q + c0 + c] = acc;
        }
    }
  }
}

template <typename T>
void segment_attention_backward_ref(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                    const std::vector<int64_t>& cu, const SegmentAttnDims& d) {
  check(cu, d);
  const int64_t Q = d.H * d.hd, ld = d.ld_in;
  std::vector<T> p, dp;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t t0 = cu[s], n = cu[s + 1] - cu[s];
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t c0 = h * d.hd;
      segment_probs_ref(p, q + t0 * ld + c0, k + t0 * ld + c0, n, d);
      auto Qr = [&](int64_t i) { return q + (t0 + i) * ld + c0; };
      auto Kr = [&](int64_t j) { return k + (t0 + j) * ld + c0; };
      auto Vr = [&](int64_t j) { return v + (t0 + j) * ld + c0; };
      auto dO = [&](int64_t i) { return dout + (t0 + i) * Q + c0; };
      // o_i = sum_j p_ij v_j: dv_j = sum_i p_ij do_i; dp_ij = do_i . v_j
      dp.assign(size_t(n * n), T(0));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < d.hd; ++c) {
          T acc = 0;
          for (int64_t i = 0; i < n; ++i) acc += p[size_t(i * n + j)] * dO(i)[c];
          dv[(t0 + j) * ld + c0 + c] = acc;
        }
      for (int64_t i = 0; i < n; ++i) {
        // p = softmax(s): ds_ij = p_ij (dp_ij - sum_l p_il dp_il)
        T dot = 0;
        for (int64_t j = 0; j < n; ++j) {
          T e = 0;
          for (int64_t c = 0; c < d.hd; ++c) e += dO(i)[c] * Vr(j)[c];
          dp[size_t(i * n + j)] = e;
          dot += e * p[size_t(i * n + j)];
        }
        for (int64_t j = 0; j < n; ++j) dp[size_t(i * n + j)] = p[size_t(i * n + j)] * (dp[size_t(i * n + j)] - dot);
      }
      // s_ij = scale q_i . k_j
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d.hd; ++c) {
          T aq = 0, ak = 0;
          for (int64_t j = 0; j < n; ++j) {
            aq += dp[size_t(i * n + j)] * Kr(j)[c];
            ak += dp[size_t(j * n + i)] * Qr(j)[c];
          }
          dq[(t0 + i) * ld + c0 + c] = T(d.scale) * aq;
          dk[(t0 + i) * ld + c0 + c] = T(d.scale) * ak;
        }
    }
  }
}

template <typename T>
void segment_attention_forward(T* o, const T* q, const T* k, const T* v, const std::vector<int64_t>& cu,
                               const SegmentAttnDims& d) {
  check(cu, d);
  const int64_t Q = d.H * d.hd, ld = d.ld_in;
  std::vector<T> s;
  for (size_t g = 0; g + 1 < cu.size(); ++g) {
    const int64_t t0 = cu[g], n = cu[g + 1] - cu[g];
    if (n == 0) continue;
    s.resize(size_t(n * n));
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t c0 = h * d.hd;
      gemm(false, true, n, n, d.hd, T(d.scale), q + t0 * ld + c0, ld, k + t0 * ld + c0, ld, T(0), s.data(), n);
      softmax_rows(s.data(), n);
      gemm(false, false, n, d.hd, n, T(1), s.data(), n, v + t0 * ld + c0, ld, T(0), o + t0 * Q + c0, Q);
    }
  }
}

template <typename T>
void segment_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                const std::vector<int64_t>& cu, const SegmentAttnDims& d) {
  check(cu, d);
  const int64_t Q = d.H * d.hd, ld = d.ld_in;
  std::vector<T> p, dp;
  for (size_t g = 0; g + 1 < cu.size(); ++g) {
    const int64_t t0 = cu[g], n = cu[g + 1] - cu[g];
    if (n == 0) continue;
    p.resize(size_t(n * n)), dp.resize(size_t(n * n));
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t c0 = h * d.hd;
      const T *Qp = q + t0 * ld + c0, *Kp = k + t0 * ld + c0, *Vp = v + t0 * ld + c0, *dO = dout + t0 * Q + c0;
      gemm(false, true, n, n, d.hd, T(d.scale), Qp, ld, Kp, ld, T(0), p.data(), n);
      softmax_rows(p.data(), n);
      gemm(true, false, n, d.hd, n, T(1), p.data(), n, dO, Q, T(0), dv + t0 * ld + c0, ld);  // dV = P^T dO
      gemm(false, true, n, n, d.hd, T(1), dO, Q, Vp, ld, T(0), dp.data(), n);               // dP = dO V^T
      for (int64_t i = 0; i < n; ++i) {
        T dot = 0;
        for (int64_t j = 0; j < n; ++j) dot += p[size_t(i * n + j)] * dp[size_t(i * n + j)];
        for (int64_t j = 0; j < n; ++j) dp[size_t(i * n + j)] = p[size_t(i * n + j)] * (dp[size_t(i * n + j)] - dot);
      }
      gemm(false, false, n, d.hd, n, T(d.scale), dp.data(), n, Kp, ld, T(0), dq + t0 * ld + c0, ld);  // dQ = dS K
      gemm(true, false, n, d.hd, n, T(d.scale), dp.data(), n, Qp, ld, T(0), dk + t0 * ld + c0, ld);   // dK = dS^T Q
    }
  }
}

#define K3_INSTANTIATE(T)                                                                                        \
  template void segment_attention_forward_ref<T>(T*, const T*, const T*, const T*, const std::vector<int64_t>&, \
                                                 const SegmentAttnDims&);                                      \
  template void segment_attention_backward_ref<T>(T*, T*, T*, const T*, const T*, const T*, const T*,           \
                                                  const std::vector<int64_t>&, const SegmentAttnDims&);         \
  template void segment_attention_forward<T>(T*, const T*, const T*, const T*, const std::vector<int64_t>&,     \
                                             const SegmentAttnDims&);                                          \
  template void segment_attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,               \
                                              const std::vector<int64_t>&, const SegmentAttnDims&);
K3_INSTANTIATE(float)
K3_INSTANTIATE(double)
#undef K3_INSTANTIATE

}  // namespace k3
