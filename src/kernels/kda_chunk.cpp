// Plain chunkwise KDA (contract and formulas in kda.h; docs/model.md section 3, "Chunkwise
// form"; the public reference is fla's naive_chunk_kda). Simple and exact rather than fast:
// the in-chunk decay factors e^(gamma_i - gamma_j), i >= j, are formed pairwise per channel
// (at most 1 since g <= 0), so nothing overflows whatever the gate; the chunk-level products
// go through k3::gemm. Heads run in parallel, each with its own scratch, allocated once per
// call (outside the chunk loop). A later issue replaces the pairwise loops by dense tiles.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"

namespace k3 {

template <typename T>
void kda_chunk_forward(T* o, T* state, const T* q, const T* k, const T* v, const T* g, const T* beta, int64_t Tn,
                       int64_t H, int64_t Dk, int64_t Dv, double scale, int64_t chunk) {
  K3_ASSERT(chunk >= 1, "kda_chunk_forward: chunk must be >= 1");
  const int64_t C = chunk;
  const int64_t ldk = H * Dk, ldv = H * Dv;  // row strides of the token-major inputs
  const T sc = T(scale);
#pragma omp parallel if (H > 1)
  {
    // Per-thread scratch: gam, Qg, Kg, Kd, W [C, Dk]; A, Tm, P [C, C]; Vp [C, Dv].
    std::vector<T> buf(5 * C * Dk + 3 * C * C + C * Dv);
    T* gam = buf.data();
    T* Qg = gam + C * Dk;  // scale * q * e^gamma
    T* Kg = Qg + C * Dk;   // k * e^gamma
    T* Kd = Kg + C * Dk;   // k * e^(gamma_last - gamma)
    T* W = Kd + C * Dk;    // Tm Kg
    T* A = W + C * Dk;     // StrictLower(diag(beta) (K e^gamma)(K e^-gamma)^T)
    T* Tm = A + C * C;     // (I + A)^-1 diag(beta)
    T* P = Tm + C * C;     // MaskIncl(Q e^gamma (K e^-gamma)^T)
    T* Vp = P + C * C;     // U, then V' = U - W S
#pragma omp for schedule(static)
    for (int64_t h = 0; h < H; ++h) {
      T* S = state + h * Dk * Dv;
      for (int64_t t0 = 0; t0 < Tn; t0 += C) {
        const int64_t L = std::min(C, Tn - t0);
        const T* qc = q + t0 * ldk + h * Dk;
        const T* kc = k + t0 * ldk + h * Dk;
        const T* gc = g + t0 * ldk + h * Dk;
        const T* vc = v + t0 * ldv + h * Dv;
        T* oc = o + t0 * ldv + h * Dv;
        // gamma = in-chunk cumulative sum of g
        for (int64_t c = 0; c < Dk; ++c) gam[c] = gc[c];
        for (int64_t i = 1; i < L; ++i)
          for (int64_t c = 0; c < Dk; ++c) gam[i * Dk + c] = gam[(i - 1) * Dk + c] + gc[i * ldk + c];
        const T* glast = gam + (L - 1) * Dk;
        for (int64_t i = 0; i < L; ++i)
          for (int64_t c = 0; c < Dk; ++c) {
            const T gi = gam[i * Dk + c];
            Qg[i * Dk + c] = sc * qc[i * ldk + c] * std::exp(gi);
            Kg[i * Dk + c] = kc[i * ldk + c] * std::exp(gi);
            Kd[i * Dk + c] = kc[i * ldk + c] * std::exp(glast[c] - gi);
          }
        // A (i > j) and P (i >= j) from the same pairwise factors e^(gamma_i - gamma_j).
        for (int64_t i = 0; i < L; ++i) {
          const T* gi = gam + i * Dk;
          const T* ki = kc + i * ldk;
          const T* qi = qc + i * ldk;
          for (int64_t j = 0; j <= i; ++j) {
            const T* gj = gam + j * Dk;
            const T* kj = kc + j * ldk;
            T a = 0, p = 0;
            for (int64_t c = 0; c < Dk; ++c) {
              const T kd = kj[c] * std::exp(gi[c] - gj[c]);
              a += ki[c] * kd;
              p += qi[c] * kd;
            }
            A[i * C + j] = j < i ? beta[(t0 + i) * H + h] * a : T(0);
            P[i * C + j] = sc * p;
          }
          for (int64_t j = i + 1; j < L; ++j) A[i * C + j] = P[i * C + j] = 0;
        }
        // (I + A)^-1 by forward substitution, row by row (unit lower triangular), then
        // Tm = (I + A)^-1 diag(beta).
        for (int64_t i = 0; i < L; ++i) {
          T* ti = Tm + i * C;
          for (int64_t m = 0; m < L; ++m) ti[m] = m == i ? T(1) : T(0);
          for (int64_t j = 0; j < i; ++j) {
            const T aij = A[i * C + j];
            const T* tj = Tm + j * C;
            for (int64_t m = 0; m <= j; ++m) ti[m] -= aij * tj[m];
          }
        }
        for (int64_t i = 0; i < L; ++i)
          for (int64_t m = 0; m <= i; ++m) Tm[i * C + m] *= beta[(t0 + m) * H + h];
        // W = Tm Kg;  U = Tm V;  V' = U - W S
        gemm(false, false, L, Dk, L, T(1), Tm, C, Kg, Dk, T(0), W, Dk);
        gemm(false, false, L, Dv, L, T(1), Tm, C, vc, ldv, T(0), Vp, Dv);
        gemm(false, false, L, Dv, Dk, T(-1), W, Dk, S, Dv, T(1), Vp, Dv);
        // O = (Q e^gamma) S + P V'
        gemm(false, false, L, Dv, Dk, T(1), Qg, Dk, S, Dv, T(0), oc, ldv);
        gemm(false, false, L, Dv, L, T(1), P, C, Vp, Dv, T(1), oc, ldv);
        // S = diag(e^gamma_last) S + (K e^(gamma_last - gamma))^T V'
        for (int64_t c = 0; c < Dk; ++c) {
          const T a = std::exp(glast[c]);
          for (int64_t j = 0; j < Dv; ++j) S[c * Dv + j] *= a;
        }
        gemm(true, false, Dk, Dv, L, T(1), Kd, Dk, Vp, Dv, T(1), S, Dv);
      }
    }
  }
}

template void kda_chunk_forward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                       const float*, int64_t, int64_t, int64_t, int64_t, double, int64_t);
template void kda_chunk_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const double*, const double*, int64_t, int64_t, int64_t, int64_t, double,
                                        int64_t);

}  // namespace k3
