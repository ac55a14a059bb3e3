// KDA gate forward and backward (see kda_gate.h): elementwise, with the per-head factor
// exp(A_log[h]) hoisted.
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
      const T a = std::exp(A_log[h]);  // per head, docs/model.md section 3
      const int64_t base = t * HD + h * D;
      if (bounded) {
        for (int64_t i = 0; i < D; ++i) g[base + i] = lb * sigmoid(a * (z[base + i] + dt_bias[h * D + i]));
      } else {
        for (int64_t i = 0; i < D; ++i) g[base + i] = -a * softplus(z[base + i] + dt_bias[h * D + i]);
      }
    }
  }
}

// Heads in parallel: each head owns its dA_log[h] and its D entries of dt_bias, and sums
// over tokens in order.
template <typename T>
void kda_gate_backward(T* dz, T* dA_log, T* ddt_bias, const T* dg, const T* z, const T* A_log, const T* dt_bias,
                       int64_t Tn, int64_t H, int64_t D, bool bounded, double lower_bound) {
  const int64_t HD = H * D;
  const T lb = T(lower_bound);
#pragma omp parallel for schedule(static) if (Tn * HD > 65536)
  for (int64_t h = 0; h < H; ++h) {
    const T a = std::exp(A_log[h]);
    const T* bias = dt_bias + h * D;
    T* dbias = ddt_bias + h * D;
    T da = 0;  // d/dA_log[h], summed over tokens and channels
    for (int64_t t = 0; t < Tn; ++t) {
      const int64_t base = t * HD + h * D;
      for (int64_t i = 0; i < D; ++i) {
        const T u = z[base + i] + bias[i];
        T du;
        if (bounded) {
          // g = lb * sigmoid(a * u)
          const T s = sigmoid(a * u);
          du = dg[base + i] * lb * s * (T(1) - s) * a;
          da += du * u;  // d(a u)/dA_log = a u
        } else {
          // g = -a * softplus(u)
          du = -dg[base + i] * a * sigmoid(u);
          da -= dg[base + i] * a * softplus(u);  // dg/dA_log = g
        }
        dz[base + i] = du;
        dbias[i] += du;
      }
    }
    dA_log[h] += da;
  }
}

template void kda_gate_forward<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                      bool, double);
template void kda_gate_forward<double>(double*, const double*, const double*, const double*, int64_t, int64_t,
                                       int64_t, bool, double);

template void kda_gate_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                       const float*, int64_t, int64_t, int64_t, bool, double);
template void kda_gate_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                        const double*, int64_t, int64_t, int64_t, bool, double);

}  // namespace k3
