// Causal softmax attention: plain reference and the blocked gemm path (see attention.h).
#include "kernels/attention.h"
#include "kernels/attention_tile.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/gemm.h"

namespace k3 {

AttentionDims AttentionDims::resolved() const {
  K3_ASSERT(Tq >= 0 && P >= 0 && H > 0 && Hkv > 0 && H % Hkv == 0, "attention: bad head/token counts");
  K3_ASSERT(Dk >= 0 && Dr >= 0 && Dk + Dr > 0 && Dv > 0, "attention: bad widths");
  AttentionDims r = *this;
  if (!r.q_head) r.q_head = Dk + Dr;
  if (!r.q_tok) r.q_tok = H * (Dk + Dr);
  if (!r.k_head) r.k_head = Dk;
  if (!r.k_tok) r.k_tok = Hkv * Dk;
  if (!r.kr_tok) r.kr_tok = Dr;
  if (!r.v_head) r.v_head = Dv;
  if (!r.v_tok) r.v_tok = Hkv * Dv;
  if (!r.o_head) r.o_head = Dv;
  if (!r.o_tok) r.o_tok = H * Dv;
  return r;
}

template <typename T>
void attention_forward_ref(T* o, const T* q, const T* k, const T* kr, const T* v, const AttentionDims& dims,
                           T* lse) {
  const AttentionDims d = dims.resolved();
  K3_ASSERT(d.Dr == 0 || kr != nullptr, "attention: shared key part missing");
  const int64_t group = d.H / d.Hkv, Tk = d.P + d.Tq;
  std::vector<T> s(size_t(std::max<int64_t>(Tk, 1)));
  for (int64_t h = 0; h < d.H; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < d.Tq; ++i) {
      const T* qi = q + i * d.q_tok + h * d.q_head;
      const int64_t nk = d.P + i + 1;  // causal: keys [0, P + i]
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < nk; ++j) {
        const T* kj = k + j * d.k_tok + g * d.k_head;
        T acc = 0;
        for (int64_t c = 0; c < d.Dk; ++c) acc += qi[c] * kj[c];
        for (int64_t c = 0; c < d.Dr; ++c) acc += qi[d.Dk + c] * kr[j * d.kr_tok + c];
        s[j] = acc * T(d.scale);
        mx = std::max(mx, s[j]);
      }
      T sum = 0;
      for (int64_t j = 0; j < nk; ++j) sum += (s[j] = std::exp(s[j] - mx));
      if (lse) lse[i * d.H + h] = mx + std::log(sum);
      T* oi = o + i * d.o_tok + h * d.o_head;
      for (int64_t c = 0; c < d.Dv; ++c) oi[c] = 0;
      for (int64_t j = 0; j < nk; ++j) {
        const T p = s[j] / sum;
        const T* vj = v + j * d.v_tok + g * d.v_head;
        for (int64_t c = 0; c < d.Dv; ++c) oi[c] += p * vj[c];
      }
    }
  }
}

template void attention_forward_ref<float>(float*, const float*, const float*, const float*, const float*,
                                           const AttentionDims&, float*);
template void attention_forward_ref<double>(double*, const double*, const double*, const double*, const double*,
                                            const AttentionDims&, double*);

void attention_forward(float* o, const float* q, const float* k, const float* kr, const float* v,
                       const AttentionDims& dims, AttentionScratch& scratch, float* lse) {
  const AttentionDims d = dims.resolved();
  K3_ASSERT(d.Dr == 0 || kr != nullptr, "attention: shared key part missing");
  if (d.Tq == 0) return;
  const int64_t group = d.H / d.Hkv, Dq = d.Dk + d.Dr, Tk = d.P + d.Tq;
  // A tile is Bt query tokens x the `group` query heads that share one kv head, so absorbed
  // decode (Hkv = 1) reads the latent cache once for all heads.
  const int64_t Bt = std::max<int64_t>(1, 64 / group);
  const int64_t R = Bt * group;
  const int64_t ntiles = (d.Tq + Bt - 1) / Bt, tasks = d.Hkv * ntiles;
  const int64_t per_thread = R * Dq + R * Tk + R * d.Dv;
  const int nthreads = tasks > 1 ? omp_get_max_threads() : 1;
  if (scratch.buf.size() < size_t(per_thread * nthreads)) scratch.buf.resize(size_t(per_thread * nthreads));

#pragma omp parallel for schedule(dynamic, 1) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    float* Qb = scratch.buf.data() + per_thread * (tasks > 1 ? omp_get_thread_num() : 0);
    float* S = Qb + R * Dq;
    float* Ob = S + R * Tk;
    const int64_t g = task / ntiles, t0 = (task % ntiles) * Bt;
    const int64_t nt = std::min(Bt, d.Tq - t0), rows = nt * group;
    const int64_t nk = d.P + t0 + nt;  // keys visible to the tile's last token
    for (int64_t ti = 0; ti < nt; ++ti)
      for (int64_t hh = 0; hh < group; ++hh)
        std::memcpy(Qb + (ti * group + hh) * Dq, q + (t0 + ti) * d.q_tok + (g * group + hh) * d.q_head,
                    sizeof(float) * size_t(Dq));
    attention_tile_scores(S, Qb, Dq, k, kr, d, g, rows, nk);
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = S + r * nk;
      const int64_t valid = d.P + t0 + r / group + 1;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, sr[j]);
      float sum = 0;
      for (int64_t j = 0; j < valid; ++j) sum += (sr[j] = std::exp(sr[j] - mx));
      if (lse) lse[(t0 + r / group) * d.H + g * group + r % group] = mx + std::log(sum);
      const float inv = 1.f / sum;
      for (int64_t j = 0; j < valid; ++j) sr[j] *= inv;
      for (int64_t j = valid; j < nk; ++j) sr[j] = 0.f;  // causal mask
    }
    gemm(false, false, rows, d.Dv, nk, 1.f, S, nk, v + g * d.v_head, d.v_tok, 0.f, Ob, d.Dv);
    for (int64_t ti = 0; ti < nt; ++ti)
      for (int64_t hh = 0; hh < group; ++hh)
        std::memcpy(o + (t0 + ti) * d.o_tok + (g * group + hh) * d.o_head, Ob + (ti * group + hh) * d.Dv,
                    sizeof(float) * size_t(d.Dv));
  }
}

}  // namespace k3
