// KDA recurrence: the plain token-by-token reference and the single-token decode step
// (contract in kda.h; docs/model.md section 3; fixtures ops/kda_recur1.json, kda_recur8.json).
#include <cmath>

#include "core/error.h"
#include "kernels/kda.h"

namespace k3 {

template <typename T>
void kda_recurrent_forward(T* o, T* state, const T* q, const T* k, const T* v, const T* g, const T* beta,
                           int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale) {
  const T sc = T(scale);
#pragma omp parallel for schedule(static) if (H * Dk * Dv * Tn > 65536)
  for (int64_t h = 0; h < H; ++h) {
    T* S = state + h * Dk * Dv;
    for (int64_t t = 0; t < Tn; ++t) {
      const T* qt = q + (t * H + h) * Dk;
      const T* kt = k + (t * H + h) * Dk;
      const T* gt = g + (t * H + h) * Dk;
      const T* vt = v + (t * H + h) * Dv;
      const T bt = beta[t * H + h];
      T* ot = o + (t * H + h) * Dv;
      // S = diag(alpha) S
      for (int64_t i = 0; i < Dk; ++i) {
        const T a = std::exp(gt[i]);
        for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] *= a;
      }
      // u = S^T k;  S = S + k (beta (v - u))^T   (ot holds u, then the delta, then o)
      for (int64_t j = 0; j < Dv; ++j) ot[j] = 0;
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) ot[j] += S[i * Dv + j] * kt[i];
      for (int64_t j = 0; j < Dv; ++j) ot[j] = bt * (vt[j] - ot[j]);
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] += kt[i] * ot[j];
      // o = S^T (scale q)
      for (int64_t j = 0; j < Dv; ++j) ot[j] = 0;
      for (int64_t i = 0; i < Dk; ++i) {
        const T qi = sc * qt[i];
        for (int64_t j = 0; j < Dv; ++j) ot[j] += S[i * Dv + j] * qi;
      }
    }
  }
}

// One token. With a = e^g and S the old state:
//   u = (a*S)^T k,  p = (a*S)^T q  (one read sweep);  d = beta (v - u);
//   S' = a*S + k d^T (one read-modify-write sweep);  o = scale (p + (q.k) d) = S'^T (scale q).
// Two sweeps is the minimum: the update needs u, which needs all of S.
void kda_decode_step(float* o, float* state, const float* q, const float* k, const float* v, const float* g,
                     const float* beta, int64_t H, int64_t Dk, int64_t Dv, double scale) {
  K3_ASSERT(Dv <= kKdaMaxDv, "kda_decode_step: Dv too large");
#pragma omp parallel for schedule(static) if (H * Dk * Dv > 65536)
  for (int64_t h = 0; h < H; ++h) {
    float* S = state + h * Dk * Dv;
    const float* qh = q + h * Dk;
    const float* kh = k + h * Dk;
    const float* gh = g + h * Dk;
    const float* vh = v + h * Dv;
    float* oh = o + h * Dv;
    float u[kKdaMaxDv];
    float qk = 0;
    for (int64_t j = 0; j < Dv; ++j) u[j] = oh[j] = 0;
    for (int64_t i = 0; i < Dk; ++i) {
      const float a = std::exp(gh[i]);
      const float ak = a * kh[i], aq = a * qh[i];
      qk += qh[i] * kh[i];
      const float* Si = S + i * Dv;
      for (int64_t j = 0; j < Dv; ++j) {
        u[j] += Si[j] * ak;
        oh[j] += Si[j] * aq;
      }
    }
    const float b = beta[h], sc = float(scale);
    for (int64_t j = 0; j < Dv; ++j) {
      u[j] = b * (vh[j] - u[j]);  // u now holds the delta d
      oh[j] = sc * (oh[j] + qk * u[j]);
    }
    for (int64_t i = 0; i < Dk; ++i) {
      const float a = std::exp(gh[i]), ki = kh[i];
      float* Si = S + i * Dv;
      for (int64_t j = 0; j < Dv; ++j) Si[j] = a * Si[j] + ki * u[j];
    }
  }
}

template void kda_recurrent_forward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                           const float*, int64_t, int64_t, int64_t, int64_t, double);
template void kda_recurrent_forward<double>(double*, double*, const double*, const double*, const double*,
                                            const double*, const double*, int64_t, int64_t, int64_t, int64_t, double);

}  // namespace k3
