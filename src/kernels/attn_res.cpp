// Attention-Residual read (see attn_res.h). Tokens are independent: parallel across rows.
#include "kernels/attn_res.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace k3 {

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
    T* o = out + t * d;
    for (int64_t i = 0; i < d; ++i) o[i] = a[0] * sources[0][t * d + i];
    for (int64_t s = 1; s < S; ++s) {
      const T* x = sources[s] + t * d;
      for (int64_t i = 0; i < d; ++i) o[i] += a[s] * x[i];
    }
  }
}

template void attn_res_forward<float>(float*, float*, const float* const*, int64_t, const float*, const float*,
                                      int64_t, int64_t, double);
template void attn_res_forward<double>(double*, double*, const double* const*, int64_t, const double*,
                                       const double*, int64_t, int64_t, double);

}  // namespace k3
