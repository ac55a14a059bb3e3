// Causal depthwise short conv + SiLU (see shortconv.h). Token-major loops so the inner loop
// over channels is contiguous and vectorises; the first K-1 tokens read the carried state.
#include "kernels/shortconv.h"

#include "core/error.h"
#include "kernels/activations.h"

namespace k3 {

template <typename T>
void shortconv_silu_forward(T* y, T* pre, T* state, const T* x, const T* w, int64_t Tn, int64_t C, int64_t K) {
  K3_ASSERT(K >= 1, "shortconv kernel size must be >= 1");
  const int64_t P = K - 1;  // carried inputs per channel
#pragma omp parallel for schedule(static) if (Tn * C * K > 262144)
  for (int64_t t = 0; t < Tn; ++t) {
    T* acc = pre ? pre + t * C : y + t * C;  // pre-SiLU accumulator
    for (int64_t c = 0; c < C; ++c) acc[c] = 0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t src = t - P + j;  // extended position; < 0 reads the carried state
      if (src >= 0) {
        const T* xs = x + src * C;
        for (int64_t c = 0; c < C; ++c) acc[c] += w[c * K + j] * xs[c];
      } else {
        for (int64_t c = 0; c < C; ++c) acc[c] += w[c * K + j] * state[c * P + (P + src)];
      }
    }
    T* yt = y + t * C;
    for (int64_t c = 0; c < C; ++c) yt[c] = silu(acc[c]);
  }
  // New state: the last P entries of [state | x] per channel, oldest first.
  if (P == 0 || Tn == 0) return;
  for (int64_t c = 0; c < C; ++c) {
    T* st = state + c * P;
    if (Tn >= P) {
      for (int64_t j = 0; j < P; ++j) st[j] = x[(Tn - P + j) * C + c];
    } else {
      for (int64_t j = 0; j < P - Tn; ++j) st[j] = st[j + Tn];
      for (int64_t j = 0; j < Tn; ++j) st[P - Tn + j] = x[j * C + c];
    }
  }
}

template void shortconv_silu_forward<float>(float*, float*, float*, const float*, const float*, int64_t, int64_t,
                                            int64_t);
template void shortconv_silu_forward<double>(double*, double*, double*, const double*, const double*, int64_t,
                                             int64_t, int64_t);

}  // namespace k3
