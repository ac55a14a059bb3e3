// Causal depthwise short conv + SiLU (see shortconv.h). Token-major loops so the inner loop
// over channels is contiguous and vectorises; the first K-1 tokens read the carried state.
#include "kernels/shortconv.h"

#include <algorithm>

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

// Channels are independent: blocks of kCB channels run in parallel, and within a block every
// inner loop is contiguous over channels. dpre is formed in dx first, then dw and dstate0
// read it, then dx is overwritten in place in ascending t: dx[s] reads dpre[s .. s+K-1] only,
// none of which has been overwritten yet (position s itself is read before it is written).
template <typename T>
void shortconv_silu_backward(T* dx, T* dw, T* dstate0, const T* dy, const T* pre, const T* state0, const T* x,
                             const T* w, int64_t Tn, int64_t C, int64_t K) {
  K3_ASSERT(K >= 1, "shortconv kernel size must be >= 1");
  constexpr int64_t kCB = 64;  // channels per block
  const int64_t P = K - 1;
  const int64_t nblk = (C + kCB - 1) / kCB;
#pragma omp parallel for schedule(static) if (Tn * C * K > 262144)
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t c0 = b * kCB, nc = std::min(kCB, C - c0);
    // dpre = dy * SiLU'(pre), SiLU'(p) = s (1 + p (1 - s)) with s = sigmoid(p)   [y = silu(acc)]
    for (int64_t t = 0; t < Tn; ++t) {
      const T* dyt = dy + t * C + c0;
      const T* pt = pre + t * C + c0;
      T* dt = dx + t * C + c0;
      for (int64_t c = 0; c < nc; ++c) {
        const T s = sigmoid(pt[c]);
        dt[c] = dyt[c] * s * (T(1) + pt[c] * (T(1) - s));
      }
    }
    // dw[c, j] += sum_t dpre[t, c] * x_ext[t - P + j, c]   [acc += w[c*K + j] * xs[c]]
    for (int64_t j = 0; j < K; ++j) {
      T acc[kCB] = {};
      for (int64_t t = 0; t < Tn; ++t) {
        const int64_t src = t - P + j;
        const T* dt = dx + t * C + c0;
        if (src >= 0) {
          const T* xs = x + src * C + c0;
          for (int64_t c = 0; c < nc; ++c) acc[c] += dt[c] * xs[c];
        } else if (state0) {
          for (int64_t c = 0; c < nc; ++c) acc[c] += dt[c] * state0[(c0 + c) * P + (P + src)];
        }
      }
      for (int64_t c = 0; c < nc; ++c) dw[(c0 + c) * K + j] += acc[c];
    }
    // dstate0[c, m]: extended position m - P is read by token t = m - j through tap j.
    if (dstate0) {
      for (int64_t c = 0; c < nc; ++c)
        for (int64_t m = 0; m < P; ++m) {
          T a = 0;
          for (int64_t j = 0; j <= m; ++j) {
            const int64_t t = m - j;
            if (t < Tn) a += w[(c0 + c) * K + j] * dx[t * C + c0 + c];
          }
          dstate0[(c0 + c) * P + m] = a;
        }
    }
    // dx[s, c] = sum_j w[c, j] dpre[s + P - j, c], in place, ascending s.
    for (int64_t s = 0; s < Tn; ++s) {
      T acc[kCB] = {};
      for (int64_t j = 0; j < K; ++j) {
        const int64_t t = s + P - j;
        if (t >= Tn) continue;
        const T* dt = dx + t * C + c0;
        for (int64_t c = 0; c < nc; ++c) acc[c] += w[(c0 + c) * K + j] * dt[c];
      }
      T* ds = dx + s * C + c0;
      for (int64_t c = 0; c < nc; ++c) ds[c] = acc[c];
    }
  }
}

template void shortconv_silu_forward<float>(float*, float*, float*, const float*, const float*, int64_t, int64_t,
                                            int64_t);
template void shortconv_silu_forward<double>(double*, double*, double*, const double*, const double*, int64_t,
                                             int64_t, int64_t);

template void shortconv_silu_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                             const float*, const float*, int64_t, int64_t, int64_t);
template void shortconv_silu_backward<double>(double*, double*, double*, const double*, const double*,
                                              const double*, const double*, const double*, int64_t, int64_t,
                                              int64_t);

}  // namespace k3
