// KDA gate (see kda_gate.h): elementwise, with the per-head factor exp(A_log[h]) hoisted.
#include "kernels/kda_gate.h"

#include <cmath>

#include "kernels/activations.h"

namespace k3 {

template <typename T>
void kda_gate_forward(T* g, const T* z, const T* A_log, const T* dt_bias, int64_t Tn, int64_t H, int64_t D,
                      bool bounded, double lower_bound) {
  const int64_t HD = H * D;
  const T lb = T(lower_bound);
#pragma omp parallel for schedule(static) if (Tn * HD > 65536)
  for (int64_t t = 0; t < Tn; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const T a = std::exp(A_log[h]);  // per head, K3_REFERENCE section 3
      const int64_t base = t * HD + h * D;
      if (bounded) {
        for (int64_t i = 0; i < D; ++i) g[base + i] = lb * sigmoid(a * (z[base + i] + dt_bias[h * D + i]));
      } else {
        for (int64_t i = 0; i < D; ++i) g[base + i] = -a * softplus(z[base + i] + dt_bias[h * D + i]);
      }
    }
  }
}

template void kda_gate_forward<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                      bool, double);
template void kda_gate_forward<double>(double*, const double*, const double*, const double*, int64_t, int64_t,
                                       int64_t, bool, double);

}  // namespace k3
