// Internal to kernels/attention*.cpp: the raw score tile shared by the blocked forward and
// backward, S[rows, nk] = scale (Qb[:, :Dk] K_g^T + Qb[:, Dk:] Kr^T) for kv head g, where Qb
// holds the gathered query rows (row stride Dq = Dk + Dr).
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/gemm.h"

namespace k3 {

inline void attention_tile_scores(float* S, const float* Qb, int64_t Dq, const float* k, const float* kr,
                                  const AttentionDims& d, int64_t g, int64_t rows, int64_t nk) {
  if (d.Dk > 0)
    gemm(false, true, rows, nk, d.Dk, float(d.scale), Qb, Dq, k + g * d.k_head, d.k_tok, 0.f, S, nk);
  else
    std::fill(S, S + rows * nk, 0.f);
  if (d.Dr > 0) gemm(false, true, rows, nk, d.Dr, float(d.scale), Qb + d.Dk, Dq, kr, d.kr_tok, 1.f, S, nk);
}

}  // namespace k3
