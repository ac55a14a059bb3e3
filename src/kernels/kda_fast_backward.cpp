// Fast chunked KDA backward (contract in kda_fast.h; plain reference kda_chunk_backward in
// kda_backward_ref.h, whose derivation this follows step for step). Per head, chunks in
// reverse order, dS = gradient of the state after the chunk. The forward's per-chunk
// state S0, R, V', Akk and Aqk come from the workspace (filled by a state pass when absent);
// the decay factors, anchored operands and the UT inverse are recomputed per chunk (cheap,
// and they would double the saved memory).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/kda_fast_impl.h"

namespace k3 {
namespace kda_fast {

namespace {

inline float dotf(const float* a, const float* b, int64_t n) {
  float r = 0;
#pragma omp simd reduction(+ : r)
  for (int64_t i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Safe path, diagonal tile I: the pairwise gradients of Akk_ij = K_i . y_ij and
// Aqk_ij = Q_i . y_ij with y_ij = K_j prod_{t=j+1..i} e^g_t, added into the row-side
// gradients dKr, dQr and the column-side dKc (already in unanchored form).
void diag_tile_safe_bwd(const Geom& gm, Scratch& s, int64_t I, float* dKr, float* dQr, float* dKc) {
  const int64_t Kp = gm.Dkp, C = gm.C;
  const float* dA = s.dAA + I * 2 * kTile * C;  // rows 0..15 dAkk, 16..31 dAqk of block I
  float *p = s.vec, *z = s.f;
  for (int64_t jl = 0; jl < kTile; ++jl) {
    const int64_t j = I * kTile + jl;
    const float *Kj = s.K + j * Kp, *Qj = s.Q + j * Kp;
    const float dq0 = dA[(kTile + jl) * C + j];
    float *dQj = dQr + j * Kp, *dKcj = dKc + j * Kp;
#pragma omp simd
    for (int64_t c = 0; c < Kp; ++c) {
      p[c] = 1.f;
      dQj[c] += dq0 * Kj[c];  // Aqk_jj = Q_j . K_j
      z[c] = dq0 * Qj[c];
    }
    for (int64_t il = jl + 1; il < kTile; ++il) {
      const int64_t i = I * kTile + il;
      const float dak = dA[il * C + j], daq = dA[(kTile + il) * C + j];
      const float *a = s.Ga + i * Kp, *Ki = s.K + i * Kp, *Qi = s.Q + i * Kp;
      float *dKi = dKr + i * Kp, *dQi = dQr + i * Kp;
#pragma omp simd
      for (int64_t c = 0; c < Kp; ++c) {
        p[c] *= a[c];
        const float y = Kj[c] * p[c];
        dKi[c] += dak * y;
        dQi[c] += daq * y;
        z[c] += (dak * Ki[c] + daq * Qi[c]) * p[c];
      }
    }
#pragma omp simd
    for (int64_t c = 0; c < Kp; ++c) dKcj[c] += z[c];
  }
}

// Chunk c of head h (chunks run in reverse order): dS is the gradient of the head's state
// after the chunk, dSn receives the gradient of the state before it.
void backward_chunk(const Geom& gm, Scratch& s, KDAWorkspace::Impl& ws, float* dq, float* dk, float* dv, float* dg,
                    float* dbeta, const float* do_, const float* q, const float* k, const float* g,
                    const float* beta, int64_t h, int64_t c, const float* dS, float* dSn) {
  const int64_t C = gm.C, Kp = gm.Dkp, Vp = gm.Dvp, Dk = gm.Dk, Dv = gm.Dv, H = gm.H, NB = gm.NB;
  const bool bf = gm.bf16;
  const int64_t t0 = c * C, n = std::min(C, gm.Tn - t0);
  prep_chunk(gm, s, q, k, nullptr, g, beta, h, t0, n, /*prefetch_v=*/false, /*keep_factors=*/true);
  // Akk, Aqk as the forward computed them (saved), the UT transform redone (cheap)
  const float *S0 = ws.state_at(h, c), *R = ws.r_at(h, c), *Vq = ws.vp_at(h, c), *Akk = ws.akk_at(h, c),
              *Aqk = ws.aqk_at(h, c);
  ut_transform(gm, s, Akk);
  if (c > 0) {  // the previous chunk's saved state, R and V' come next: start fetching them
    prefetch_floats(ws.state_at(h, c - 1), Kp * Vp);
    prefetch_floats(ws.r_at(h, c - 1), 2 * C * Vp);
    prefetch_floats(ws.akk_at(h, c - 1), 2 * C * C);
  }
  float* dO = s.G2 + C * Vp;  // G2 = [-dR ; dO]
  for (int64_t i = 0; i < n; ++i) prefetch_floats(do_ + ((t0 + i) * H + h) * Dv, Dv);
  for (int64_t i = 0; i < C; ++i) {
    float* row = dO + i * Vp;
    if (i < n) {
      std::memcpy(row, do_ + ((t0 + i) * H + h) * Dv, size_t(Dv) * 4);
      std::fill(row + Dv, row + Vp, 0.f);
    } else {
      std::fill(row, row + Vp, 0.f);
    }
  }
  // S1 = diag(El) S0 + Kd^T V'  and  O = Q E S0 + Aqk V':  dV' = Kd dS + Aqk^T dO
  const BOp bdO = b_op(bf, dO, Vp, false, C, Vp, s.hb2 + C * Vp);  // the dO half of [-dR ; dO]
  mm(s.dVp, Vp, a_op(bf, s.Kd, Kp, false, C, Kp, s.ha), b_op(bf, dS, Vp, false, Kp, Vp, s.hb1), C, Vp, Kp, 1.f,
     false);
  mm(s.dVp, Vp, a_op(bf, Aqk, C, true, C, C, s.ha), bdO, C, Vp, C, 1.f, true, Tri::Upper);
  // V' = Tm R:  dR = Tm^T dV', stored negated as the top half of G2 = [-dR ; dO]
  mm(s.G2, Vp, a_op(bf, s.Tm, C, true, C, C, s.ha), b_op(bf, s.dVp, Vp, false, C, Vp, s.hb1), C, Vp, C, -1.f,
     false, Tri::Upper);
  // R = V - K E S0:  dV = dR
  for (int64_t i = 0; i < n; ++i) store_row(dv + ((t0 + i) * H + h) * Dv, s.G2 + i * Vp, Dv, -1.f, gm.stream);
  BOp bG2 = b_op(bf, s.G2, Vp, false, C, Vp, s.hb2);  // completes [-dR ; dO] (2C rows)
  // V' = Tm R:  dTm = dV' R^T;  O: dAqk = MaskIncl(dO V'^T)   (16-row blocks, lower part only)
  {
    const AOp a = a_op(bf, s.dVp, Vp, false, C, Vp, s.ha);
    const BOp b = b_op(bf, R, Vp, true, Vp, C, s.hb1, s.TB);
    for (int64_t I = 0; I < NB; ++I)
      mm(s.dT + I * kTile * C, C, a_rows(a, I * kTile), b, kTile, (I + 1) * kTile, Vp, 1.f, false);
  }
  {
    const AOp a = a_op(bf, dO, Vp, false, C, Vp, s.ha);
    const BOp b = b_op(bf, Vq, Vp, true, Vp, C, s.hb1, s.TB);
    for (int64_t I = 0; I < NB; ++I)
      mm(s.dAqk + I * kTile * C, C, a_rows(a, I * kTile), b, kTile, (I + 1) * kTile, Vp, 1.f, false);
  }
  // R = V - K E S0, O = Q E S0 + ...:  [dKe ; dQe] = [-dR ; dO] S0^T
  mm(s.dKQe, Kp, a_op(bf, s.G2, Vp, false, 2 * C, Vp, s.ha), b_op(bf, S0, Vp, true, Vp, Kp, s.hb1, s.TB), 2 * C,
     Kp, Vp, 1.f, false);
  // S1 = ... + Kd^T V':  dKd = V' dS^T
  mm(s.dKd, Kp, a_op(bf, Vq, Vp, false, C, Vp, s.ha), b_op(bf, dS, Vp, true, Vp, Kp, s.hb1, s.TB), C, Kp, Vp, 1.f,
     false);
  // S1 = diag(El) S0 + ...:  dEl = rowsum(dS o S0);  dS0 = diag(El) dS + [K E ; Q E]^T [-dR ; dO]
  for (int64_t d = 0; d < Kp; ++d) {
    s.dEl[d] = dotf(dS + d * Vp, S0 + d * Vp, Vp);
    const float e = s.El[d];
#pragma omp simd
    for (int64_t j = 0; j < Vp; ++j) dSn[d * Vp + j] = e * dS[d * Vp + j];
  }
  mm(dSn, Vp, a_op(bf, s.KQe, Kp, true, Kp, 2 * C, s.ha), bG2, Kp, Vp, 2 * C, 1.f, true);
  // Tm = Linv diag(beta):  dLinv = dTm diag(beta), dbeta_j = sum_i dTm_ij Linv_ij   (f32)
  std::fill(s.dbeta, s.dbeta + C, 0.f);
  for (int64_t i = 0; i < C; ++i) {
    float *dl = s.dLinv + i * C, *dt = s.dT + i * C;
    const float* li = s.Linv + i * C;
    for (int64_t j = 0; j <= i; ++j) {
      dl[j] = dt[j] * s.beta[j];
      s.dbeta[j] += dt[j] * li[j];
    }
    std::fill(dl + i + 1, dl + C, 0.f);
  }
  // Linv = L^-1:  dL = -Linv^T dLinv Linv^T   (f32 in both modes)
  mm_f32(s.M1, C, s.Linv, C, true, s.dLinv, C, C, C, C, 1.f, false, Tri::Upper);
  transpose_f32(s.LT, C, s.Linv, C, C, C);
  mm_f32(s.dL, C, s.M1, C, false, s.LT, C, C, C, C, -1.f, false);
  // L = I + diag(beta) Akk:  dAkk = diag(beta) dL (strict lower), dbeta_i += dL_i . Akk_i.
  // dAA block I: rows 0..15 dAkk, rows 16..31 dAqk (diagonal included).
  for (int64_t I = 0; I < NB; ++I)
    for (int64_t r = 0; r < kTile; ++r) {
      const int64_t i = I * kTile + r;
      float *dkk = s.dAA + (I * 2 * kTile + r) * C, *dqk = dkk + kTile * C;
      const float *dl = s.dL + i * C, *akk = Akk + i * C, *aq = s.dAqk + i * C;
      float db = 0;
      for (int64_t j = 0; j < i; ++j) {
        dkk[j] = s.beta[i] * dl[j];
        db += dl[j] * akk[j];
      }
      s.dbeta[i] += db;
      std::fill(dkk + i, dkk + C, 0.f);
      std::memcpy(dqk, aq, size_t(i + 1) * 4);
      std::fill(dqk + i + 1, dqk + C, 0.f);
    }
  // Tiles [Akk_IJ ; Aqk_IJ] = ([X_I ; Qx_I] diag f) Y_J^T:
  //   d[X_I ; Qx_I] += (dA_IJ Y_J) diag f;   dY_J += (dA_IJ^T [X_I ; Qx_I]) diag f
  std::memset(s.dXQ, 0, size_t(2 * C * Kp) * 4);
  std::memset(s.dY, 0, size_t(C * Kp) * 4);
  const BOp bY = b_op(bf, s.Y, Kp, false, C, Kp, s.hY);
  const BOp bXQ = b_op(bf, s.XQ, Kp, false, 2 * C, Kp, s.hXQ);
  for (int64_t I = 0; I < NB; ++I)
    for (int64_t J = 0; J <= I; ++J) {
      if (J == I && !gm.dense) continue;
      const float* f = nullptr;
      if (J < I) {
        tile_factor(gm, s, I, J, s.Asc);
        f = s.Asc;
      }
      const float* dA = s.dAA + I * 2 * kTile * C + J * kTile;
      mm(s.dXQ + I * 2 * kTile * Kp, Kp, a_op(bf, dA, C, false, 2 * kTile, kTile, s.ha), b_sub(bY, J * kTile, 0),
         2 * kTile, Kp, kTile, 1.f, true, Tri::None, f);
      mm(s.dY + J * kTile * Kp, Kp, a_op(bf, dA, C, true, kTile, 2 * kTile, s.ha), b_sub(bXQ, I * 2 * kTile, 0),
         kTile, Kp, 2 * kTile, 1.f, true, Tri::None, f);
    }
  // Back to unanchored gradients: dKr = dX o Ex, dQr = dQx o Ex, dKc = dY o Ey (in place).
  for (int64_t i = 0; i < C; ++i) {
    const int64_t I = i / kTile, r = i % kTile;
    float *dX = s.dXQ + (I * 2 * kTile + r) * Kp, *dQx = dX + kTile * Kp, *dYi = s.dY + i * Kp;
    const float *ex = s.Ex + i * Kp, *ey = s.Ey + i * Kp;
#pragma omp simd
    for (int64_t d = 0; d < Kp; ++d) {
      dX[d] *= ex[d];
      dQx[d] *= ex[d];
      dYi[d] *= ey[d];
    }
  }
  if (!gm.dense)
    for (int64_t I = 0; I < NB; ++I) {
      // row-side pointers with the block layout of dXQ: dKr row i at block I, row r
      float* dKr = s.dXQ + I * 2 * kTile * Kp - I * kTile * Kp;  // so that dKr + i*Kp hits row r
      float* dQr = dKr + kTile * Kp;
      diag_tile_safe_bwd(gm, s, I, dKr, dQr, s.dY);
    }
  // Assemble: Q E, K E, Kd, the tiles; dG is the gradient of the cumulative G.
  float* dGl = s.dG + (C - 1) * Kp;
  std::memset(s.dG, 0, size_t(C * Kp) * 4);
  for (int64_t i = 0; i < C; ++i) {
    const int64_t I = i / kTile, r = i % kTile;
    const float *dKr = s.dXQ + (I * 2 * kTile + r) * Kp, *dQr = dKr + kTile * Kp, *dKc = s.dY + i * Kp;
    const float *dKe = s.dKQe + i * Kp, *dQe = s.dKQe + (C + i) * Kp, *dKd = s.dKd + i * Kp;
    const float *E = s.E + i * Kp, *Edl = s.Edl + i * Kp, *Ke = s.KQe + i * Kp, *Qe = s.KQe + (C + i) * Kp,
                *Kd = s.Kd + i * Kp, *Ki = s.K + i * Kp, *Qi = s.Q + i * Kp;
    float *dQ = s.E + i * Kp, *dK = s.Edl + i * Kp, *dG = s.dG + i * Kp;  // E, Edl are consumed here
#pragma omp simd
    for (int64_t d = 0; d < Kp; ++d) {
      const float e = E[d], edl = Edl[d];
      dG[d] += dQe[d] * Qe[d] + dKe[d] * Ke[d] - dKd[d] * Kd[d] + Ki[d] * (dKr[d] - dKc[d]) + Qi[d] * dQr[d];
      dQ[d] = dQe[d] * e + dQr[d];
      dK[d] = dKe[d] * e + dKd[d] * edl + dKr[d] + dKc[d];
      dGl[d] += dKd[d] * Kd[d];
    }
  }
#pragma omp simd
  for (int64_t d = 0; d < Kp; ++d) dGl[d] += s.dEl[d] * s.El[d];
  // G = cumsum g:  dg = reverse cumsum of dG
  for (int64_t i = C - 2; i >= 0; --i)
#pragma omp simd
    for (int64_t d = 0; d < Kp; ++d) s.dG[i * Kp + d] += s.dG[(i + 1) * Kp + d];
  const float sc = gm.scale;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ro = (t0 + i) * H + h;
    store_row(dq + ro * Dk, s.E + i * Kp, Dk, sc, gm.stream);  // dQ (in E); Q = scale q
    store_row(dk + ro * Dk, s.Edl + i * Kp, Dk, 1.f, gm.stream);  // dK (in Edl)
    store_row(dg + ro * Dk, s.dG + i * Kp, Dk, 1.f, gm.stream);
    dbeta[ro] = s.dbeta[i];
  }
}

// Heads [h0, h1), chunk-major in reverse (as forward_heads), each with its own pair of state
// gradient buffers.
void backward_heads(const Geom& gm, Scratch& s, KDAWorkspace::Impl& ws, float* dq, float* dk, float* dv, float* dg,
                    float* dbeta, float* dstate0, const float* do_, const float* dstate_final, const float* q,
                    const float* k, const float* g, const float* beta, int64_t h0, int64_t h1) {
  const int64_t KV = gm.Dkp * gm.Dvp, Dk = gm.Dk, Dv = gm.Dv, Vp = gm.Dvp, nh = h1 - h0;
  s.heads.reserve(size_t(2 * nh * KV) * 4);
  // Head j's two state-gradient buffers are base + 2 j KV and the next KV floats; every head
  // swaps them once per chunk, so one parity says which is current (no per-call allocation).
  float* base = s.heads.as<float>();
  bool flip = false;
  auto cur = [&](int64_t j) { return base + 2 * j * KV + (flip ? KV : 0); };
  auto nxt = [&](int64_t j) { return base + 2 * j * KV + (flip ? 0 : KV); };
  for (int64_t j = 0; j < nh; ++j) {
    std::memset(cur(j), 0, size_t(KV) * 4);
    if (dstate_final)
      for (int64_t d = 0; d < Dk; ++d)
        std::memcpy(cur(j) + d * Vp, dstate_final + ((h0 + j) * Dk + d) * Dv, size_t(Dv) * 4);
  }
  for (int64_t c = gm.NT - 1; c >= 0; --c) {
    for (int64_t j = 0; j < nh; ++j)
      backward_chunk(gm, s, ws, dq, dk, dv, dg, dbeta, do_, q, k, g, beta, h0 + j, c, cur(j), nxt(j));
    flip = !flip;
  }
  if (dstate0)
    for (int64_t j = 0; j < nh; ++j)
      for (int64_t d = 0; d < Dk; ++d)
        std::memcpy(dstate0 + ((h0 + j) * Dk + d) * Dv, cur(j) + d * Vp, size_t(Dv) * 4);
}

}  // namespace
}  // namespace kda_fast

void kda_chunk_fast_backward(float* dq, float* dk, float* dv, float* dg, float* dbeta, float* dstate0,
                             const float* do_, const float* dstate_final, const float* q, const float* k,
                             const float* v, const float* g, const float* beta, const float* state0, int64_t Tn,
                             int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt,
                             KDAWorkspace& ws) {
  using namespace kda_fast;
  const Geom gm = make_geom(Tn, H, Dk, Dv, scale, opt);
  auto& W = ws.impl();
  if (Tn == 0) {
    if (dstate0) {
      for (int64_t i = 0; i < H * Dk * Dv; ++i) dstate0[i] = dstate_final ? dstate_final[i] : 0.f;
    }
    return;
  }
  W.prepare_threads(gm);
  const bool have = W.saved && W.saved_geom.same(gm);
  if (!have) {
    // No saved forward for these shapes and options: the state pass fills the workspace.
    W.saved = false;
    W.prepare_saved(gm);
#pragma omp parallel
    {
      FlushDenormals ftz;
      int64_t h0, h1;
      head_range(H, omp_get_thread_num(), omp_get_num_threads(), &h0, &h1);
      forward_heads(gm, W.threads[omp_get_thread_num()], W, nullptr, state0, nullptr, q, k, v, g, beta, h0, h1, true);
    }
    W.saved = true;
  }
#pragma omp parallel
  {
    FlushDenormals ftz;
    int64_t h0, h1;
    head_range(H, omp_get_thread_num(), omp_get_num_threads(), &h0, &h1);
    backward_heads(gm, W.threads[omp_get_thread_num()], W, dq, dk, dv, dg, dbeta, dstate0, do_, dstate_final, q, k,
                   g, beta, h0, h1);
    store_fence();
  }
}

}  // namespace k3
