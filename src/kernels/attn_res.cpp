// Attention-Residual read and its backward (see attn_res.h). Tokens are independent:
// parallel across rows.
#include "kernels/attn_res.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace k3 {

namespace {

// out[0, d) = sum_s alpha[s] src_s[t], in source order: the forward's sum and its recomputation
// in the backward (attn_res_mix) are this one loop, so they agree bit for bit.
template <typename T>
void attn_res_mix_row(T* o, const T* a, const T* const* sources, int64_t S, int64_t t, int64_t d) {
  for (int64_t i = 0; i < d; ++i) o[i] = a[0] * sources[0][t * d + i];
  for (int64_t s = 1; s < S; ++s) {
    const T* x = sources[s] + t * d;
    for (int64_t i = 0; i < d; ++i) o[i] += a[s] * x[i];
  }
}

}  // namespace

template <typename T>
void attn_res_forward(T* out, T* alpha, const T* const* sources, int64_t S, const T* w_norm, const T* w_proj,
                      int64_t Tn, int64_t d, double eps) {
  K3_ASSERT(S > 0, "attn_res: no sources");
  std::vector<T> own;  // alpha storage when the caller does not keep it (one allocation per call)
  if (!alpha) {
    own.resize(size_t(Tn * S));
    alpha = own.data();
  }
#pragma omp parallel for schedule(static) if (Tn * S * d > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    T* a = alpha + t * S;
    T mx = -INFINITY;
    for (int64_t s = 0; s < S; ++s) {
      const T* x = sources[s] + t * d;
      T ss = 0, dot = 0;
      for (int64_t i = 0; i < d; ++i) {
        ss += x[i] * x[i];
        dot += w_proj[i] * w_norm[i] * x[i];
      }
      // w_p . (w_n * x * rstd) with rstd = 1/sqrt(mean(x^2) + eps), as RMSNorm computes it.
      a[s] = dot / std::sqrt(ss / T(d) + T(eps));
      mx = std::max(mx, a[s]);
    }
    T sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += (a[s] = std::exp(a[s] - mx));
    for (int64_t s = 0; s < S; ++s) a[s] /= sum;
    attn_res_mix_row<T>(out + t * d, a, sources, S, t, d);
  }
}

template <typename T>
void attn_res_mix(T* out, const T* alpha, const T* const* sources, int64_t S, int64_t Tn, int64_t d) {
#pragma omp parallel for schedule(static) if (Tn * S * d > 65536)
  for (int64_t t = 0; t < Tn; ++t) attn_res_mix_row<T>(out + t * d, alpha + t * S, sources, S, t, d);
}

template <typename T>
void attn_res_backward(T* const* dsources, T* dw_norm, T* dw_proj, const T* dout, const T* alpha,
                       const T* const* sources, int64_t S, const T* w_norm, const T* w_proj, int64_t Tn, int64_t d,
                       double eps) {
  K3_ASSERT(S > 0, "attn_res: no sources");
  // g[t, s] = dscore_s * rstd_s: what the parameter gradients need per (token, source).
  std::vector<T> g(size_t(Tn * S)), work(size_t(Tn * S * 2));
#pragma omp parallel for schedule(static) if (Tn * S * d > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    const T* a = alpha + t * S;
    const T* dy = dout + t * d;
    T* rs = work.data() + t * S * 2;  // [S] rstd_s
    T* dot = rs + S;                  // [S] (w_p * w_n) . src_s
    T* gt = g.data() + t * S;         // [S] dalpha_s, then dscore_s * rstd_s
    T sum_ad = 0;
    for (int64_t s = 0; s < S; ++s) {
      const T* x = sources[s] + t * d;
      T ss = 0, dt = 0, da = 0;
      for (int64_t i = 0; i < d; ++i) {
        ss += x[i] * x[i];
        dt += w_proj[i] * w_norm[i] * x[i];
        da += dy[i] * x[i];  // out = sum_s alpha_s src_s -> dalpha_s = dout . src_s
      }
      rs[s] = T(1) / std::sqrt(ss / T(d) + T(eps));
      dot[s] = dt;
      gt[s] = da;
      sum_ad += a[s] * da;
    }
    for (int64_t s = 0; s < S; ++s) {
      // alpha = softmax(score): dscore_s = alpha_s (dalpha_s - sum alpha dalpha).
      const T dsc = a[s] * (gt[s] - sum_ad);
      // score_s = rstd_s (c . x), c = w_p * w_n, rstd = (mean x^2 + eps)^-1/2:
      // d score / d x_i = rstd c_i - (c . x) rstd^3 x_i / d.
      const T r = rs[s], k1 = dsc * r, k2 = dsc * dot[s] * r * r * r / T(d);
      const T* x = sources[s] + t * d;
      T* dx = dsources[s] + t * d;
      for (int64_t i = 0; i < d; ++i) dx[i] += a[s] * dy[i] + k1 * w_proj[i] * w_norm[i] - k2 * x[i];
      gt[s] = k1;
    }
  }
  // score_s = sum_i w_p[i] w_n[i] x_i rstd_s: acc_i = sum_t sum_s dscore rstd x_i.
  constexpr int64_t kCols = 256;
  const int64_t nblk = (d + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (Tn * S * d > 65536)
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t i0 = b * kCols, i1 = std::min(d, i0 + kCols);
    T acc[kCols] = {};
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t s = 0; s < S; ++s) {
        const T gs = g[t * S + s];
        const T* x = sources[s] + t * d;
        for (int64_t i = i0; i < i1; ++i) acc[i - i0] += gs * x[i];
      }
    for (int64_t i = i0; i < i1; ++i) {
      dw_proj[i] += w_norm[i] * acc[i - i0];
      dw_norm[i] += w_proj[i] * acc[i - i0];
    }
  }
}

template void attn_res_mix<float>(float*, const float*, const float* const*, int64_t, int64_t, int64_t);
template void attn_res_mix<double>(double*, const double*, const double* const*, int64_t, int64_t, int64_t);
template void attn_res_forward<float>(float*, float*, const float* const*, int64_t, const float*, const float*,
                                      int64_t, int64_t, double);
template void attn_res_forward<double>(double*, double*, const double* const*, int64_t, const double*,
                                       const double*, int64_t, int64_t, double);

template void attn_res_backward<float>(float* const*, float*, float*, const float*, const float*,
                                       const float* const*, int64_t, const float*, const float*, int64_t, int64_t,
                                       double);
template void attn_res_backward<double>(double* const*, double*, double*, const double*, const double*,
                                        const double* const*, int64_t, const double*, const double*, int64_t,
                                        int64_t, double);

}  // namespace k3
