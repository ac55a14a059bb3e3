// Causal softmax attention backward: plain reference and the blocked gemm path (see
// attention.h). Gradients are assigned; dk/dv/dkr are zeroed first and then accumulated, so
// dk and dv may alias.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/attention_tile.h"
#include "kernels/gemm.h"

namespace k3 {

namespace {

// Zeroes rows [0, n) of width w with row stride `stride` starting at p.
template <typename T>
void zero_rows(T* p, int64_t n, int64_t w, int64_t stride) {
  for (int64_t r = 0; r < n; ++r) std::fill(p + r * stride, p + r * stride + w, T(0));
}

}  // namespace

template <typename T>
void attention_backward_ref(T* dq, T* dk, T* dkr, T* dv, const T* dout, const T* /*o*/, const T* /*lse*/,
                            const T* q, const T* k, const T* kr, const T* v, const AttentionDims& dims) {
  const AttentionDims d = dims.resolved();
  K3_ASSERT(d.Dr == 0 || (kr != nullptr && dkr != nullptr), "attention_backward: shared key part missing");
  const int64_t group = d.H / d.Hkv, Tk = d.P + d.Tq, Dq = d.Dk + d.Dr;
  for (int64_t g = 0; g < d.Hkv; ++g) {
    zero_rows(dk + g * d.k_head, Tk, d.Dk, d.k_tok);
    zero_rows(dv + g * d.v_head, Tk, d.Dv, d.v_tok);
  }
  if (d.Dr > 0) zero_rows(dkr, Tk, d.Dr, d.kr_tok);
  std::vector<T> p(size_t(std::max<int64_t>(Tk, 1))), dp(p.size());
  const T scale = T(d.scale);
  for (int64_t h = 0; h < d.H; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < d.Tq; ++i) {
      const T* qi = q + i * d.q_tok + h * d.q_head;
      const T* doi = dout + i * d.o_tok + h * d.o_head;
      const int64_t nk = d.P + i + 1;
      // Forward: s_ij = scale (q_i[:Dk] . k_j + q_i[Dk:] . kr_j); p = softmax_j(s).
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < nk; ++j) {
        const T* kj = k + j * d.k_tok + g * d.k_head;
        T acc = 0;
        for (int64_t c = 0; c < d.Dk; ++c) acc += qi[c] * kj[c];
        for (int64_t c = 0; c < d.Dr; ++c) acc += qi[d.Dk + c] * kr[j * d.kr_tok + c];
        p[j] = acc * scale;
        mx = std::max(mx, p[j]);
      }
      T sum = 0;
      for (int64_t j = 0; j < nk; ++j) sum += (p[j] = std::exp(p[j] - mx));
      // Forward: o_i = sum_j p_ij v_j  ->  dp_ij = dout_i . v_j, dv_j += p_ij dout_i.
      T pdp = 0;
      for (int64_t j = 0; j < nk; ++j) {
        p[j] /= sum;
        const T* vj = v + j * d.v_tok + g * d.v_head;
        T* dvj = dv + j * d.v_tok + g * d.v_head;
        T acc = 0;
        for (int64_t c = 0; c < d.Dv; ++c) {
          acc += doi[c] * vj[c];
          dvj[c] += p[j] * doi[c];
        }
        dp[j] = acc;
        pdp += p[j] * acc;
      }
      // Softmax: ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij'); then through s = scale q . k.
      T* dqi = dq + i * d.q_tok + h * d.q_head;
      std::fill(dqi, dqi + Dq, T(0));
      for (int64_t j = 0; j < nk; ++j) {
        const T ds = p[j] * (dp[j] - pdp) * scale;
        const T* kj = k + j * d.k_tok + g * d.k_head;
        T* dkj = dk + j * d.k_tok + g * d.k_head;
        for (int64_t c = 0; c < d.Dk; ++c) {
          dqi[c] += ds * kj[c];
          dkj[c] += ds * qi[c];
        }
        for (int64_t c = 0; c < d.Dr; ++c) {
          dqi[d.Dk + c] += ds * kr[j * d.kr_tok + c];
          dkr[j * d.kr_tok + c] += ds * qi[d.Dk + c];
        }
      }
    }
  }
}

template void attention_backward_ref<float>(float*, float*, float*, float*, const float*, const float*,
                                            const float*, const float*, const float*, const float*, const float*,
                                            const AttentionDims&);
template void attention_backward_ref<double>(double*, double*, double*, double*, const double*, const double*,
                                             const double*, const double*, const double*, const double*,
                                             const double*, const AttentionDims&);

void attention_backward(float* dq, float* dk, float* dkr, float* dv, const float* dout, const float* o,
                        const float* lse, const float* q, const float* k, const float* kr, const float* v,
                        const AttentionDims& dims, AttentionScratch& scratch) {
  const AttentionDims d = dims.resolved();
  K3_ASSERT(d.Dr == 0 || (kr != nullptr && dkr != nullptr), "attention_backward: shared key part missing");
  K3_ASSERT(o != nullptr && lse != nullptr, "attention_backward: the blocked path needs the forward's o and lse");
  const int64_t group = d.H / d.Hkv, Dq = d.Dk + d.Dr, Tk = d.P + d.Tq;
  if (d.Dr > 0) zero_rows(dkr, Tk, d.Dr, d.kr_tok);
  if (d.Tq == 0) {
    for (int64_t g = 0; g < d.Hkv; ++g) {
      zero_rows(dk + g * d.k_head, Tk, d.Dk, d.k_tok);
      zero_rows(dv + g * d.v_head, Tk, d.Dv, d.v_tok);
    }
    return;
  }
  // Tile: Bt query tokens x the `group` heads sharing kv head g (as in the forward).
  const int64_t Bt = std::max<int64_t>(1, 64 / group), R = Bt * group;
  const int64_t ntiles = (d.Tq + Bt - 1) / Bt;
  const int64_t per_thread = R * Dq + R * d.Dv + 2 * R + 2 * R * Tk + R * Dq;
  const int nthreads = d.Hkv > 1 ? omp_get_max_threads() : 1;
  // Per-kv-head partial dkr [Hkv, Tk, Dr] (kr is shared by every head), summed afterwards in
  // head order; with one kv head the task writes dkr directly.
  const int64_t kr_part = d.Hkv > 1 ? d.Hkv * Tk * d.Dr : 0;
  const size_t need = size_t(per_thread * nthreads + kr_part);
  if (scratch.buf.size() < need) scratch.buf.resize(need);
  float* kr_parts = scratch.buf.data() + per_thread * nthreads;

#pragma omp parallel for schedule(dynamic, 1) if (d.Hkv > 1)
  for (int64_t g = 0; g < d.Hkv; ++g) {
    float* Qb = scratch.buf.data() + per_thread * (d.Hkv > 1 ? omp_get_thread_num() : 0);
    float* dOb = Qb + R * Dq;    // [R, Dv]
    float* Drow = dOb + R * d.Dv;  // [R] dout_i . o_i
    float* Lrow = Drow + R;        // [R] lse
    float* Pm = Lrow + R;          // [R, nk] probabilities
    float* dS = Pm + R * Tk;       // [R, nk] dP, then dS
    float* dQb = dS + R * Tk;      // [R, Dq]
    float* dkr_g = d.Dr == 0 ? nullptr : (d.Hkv > 1 ? kr_parts + g * Tk * d.Dr : dkr);
    const int64_t dkr_ld = d.Hkv > 1 ? d.Dr : d.kr_tok;
    zero_rows(dk + g * d.k_head, Tk, d.Dk, d.k_tok);
    zero_rows(dv + g * d.v_head, Tk, d.Dv, d.v_tok);
    if (dkr_g && d.Hkv > 1) std::fill(dkr_g, dkr_g + Tk * d.Dr, 0.f);
    for (int64_t tile = 0; tile < ntiles; ++tile) {
      const int64_t t0 = tile * Bt, nt = std::min(Bt, d.Tq - t0), rows = nt * group;
      const int64_t nk = d.P + t0 + nt;
      for (int64_t ti = 0; ti < nt; ++ti)
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t r = ti * group + hh, t = t0 + ti, h = g * group + hh;
          std::memcpy(Qb + r * Dq, q + t * d.q_tok + h * d.q_head, sizeof(float) * size_t(Dq));
          const float* dor = dout + t * d.o_tok + h * d.o_head;
          const float* orow = o + t * d.o_tok + h * d.o_head;
          float acc = 0;
          for (int64_t c = 0; c < d.Dv; ++c) {
            dOb[r * d.Dv + c] = dor[c];
            acc += dor[c] * orow[c];
          }
          Drow[r] = acc;
          Lrow[r] = lse[t * d.H + h];
        }
      // Forward: S = scale (Q K^T + Q_r Kr^T); P = exp(S - lse), causal mask.
      attention_tile_scores(Pm, Qb, Dq, k, kr, d, g, rows, nk);
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = Pm + r * nk;
        const int64_t valid = d.P + t0 + r / group + 1;
        for (int64_t j = 0; j < valid; ++j) pr[j] = std::exp(pr[j] - Lrow[r]);
        for (int64_t j = valid; j < nk; ++j) pr[j] = 0.f;
      }
      // Forward: O = P V  ->  dV += P^T dO;  dP = dO V^T.
      gemm(true, false, nk, d.Dv, rows, 1.f, Pm, nk, dOb, d.Dv, 1.f, dv + g * d.v_head, d.v_tok);
      gemm(false, true, rows, nk, d.Dv, 1.f, dOb, d.Dv, v + g * d.v_head, d.v_tok, 0.f, dS, nk);
      // Softmax backward: dS = P (dP - D) scale (masked entries have P = 0).
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < nk; ++j) dS[r * nk + j] = Pm[r * nk + j] * (dS[r * nk + j] - Drow[r]) * float(d.scale);
      // S = Q K^T: dK += dS^T Q, dKr += dS^T Q_r, dQ = dS [K | Kr].
      if (d.Dk > 0) {
        gemm(true, false, nk, d.Dk, rows, 1.f, dS, nk, Qb, Dq, 1.f, dk + g * d.k_head, d.k_tok);
        gemm(false, false, rows, d.Dk, nk, 1.f, dS, nk, k + g * d.k_head, d.k_tok, 0.f, dQb, Dq);
      }
      if (d.Dr > 0) {
        gemm(true, false, nk, d.Dr, rows, 1.f, dS, nk, Qb + d.Dk, Dq, 1.f, dkr_g, dkr_ld);
        gemm(false, false, rows, d.Dr, nk, 1.f, dS, nk, kr, d.kr_tok, 0.f, dQb + d.Dk, Dq);
      }
      for (int64_t ti = 0; ti < nt; ++ti)
        for (int64_t hh = 0; hh < group; ++hh)
          std::memcpy(dq + (t0 + ti) * d.q_tok + (g * group + hh) * d.q_head, dQb + (ti * group + hh) * Dq,
                      sizeof(float) * size_t(Dq));
    }
  }
  if (d.Dr > 0 && d.Hkv > 1)
    for (int64_t g = 0; g < d.Hkv; ++g)
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t c = 0; c < d.Dr; ++c) dkr[j * d.kr_tok + c] += kr_parts[(g * Tk + j) * d.Dr + c];
}

}  // namespace k3
