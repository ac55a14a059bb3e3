// Plain KDA backward references (contract in kda_backward_ref.h; docs/model.md section 3).
// Written for clarity: one head at a time, states recomputed from checkpoints, every line of
// a backward quotes the forward line it differentiates.
#include "kernels/kda_backward_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/gemm.h"

namespace k3 {

namespace {

// Token-major views of one head.
template <typename T>
struct HeadView {
  const T *q, *k, *v, *g, *beta;
  int64_t H, Dk, Dv;
  const T* qt(int64_t t) const { return q + t * H * Dk; }
  const T* kt(int64_t t) const { return k + t * H * Dk; }
  const T* vt(int64_t t) const { return v + t * H * Dv; }
  const T* gt(int64_t t) const { return g + t * H * Dk; }
  T bt(int64_t t) const { return beta[t * H]; }
};

// One token of the forward recurrence on S (Dk x Dv), kda.h's order.
template <typename T>
void step(T* S, const HeadView<T>& hv, int64_t t) {
  const int64_t Dk = hv.Dk, Dv = hv.Dv;
  const T *kt = hv.kt(t), *vt = hv.vt(t), *gt = hv.gt(t);
  std::vector<T> u(Dv, T(0));
  for (int64_t i = 0; i < Dk; ++i) {
    const T a = std::exp(gt[i]);
    for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] *= a;  // S = diag(alpha) S
  }
  for (int64_t i = 0; i < Dk; ++i)
    for (int64_t j = 0; j < Dv; ++j) u[j] += S[i * Dv + j] * kt[i];  // u = S^T k
  for (int64_t i = 0; i < Dk; ++i)
    for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] += kt[i] * hv.bt(t) * (vt[j] - u[j]);  // S += k (beta (v - u))^T
}

}  // namespace

template <typename T>
void kda_recurrent_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* dstate0, const T* do_, const T* dstate_final,
                            const T* q, const T* k, const T* v, const T* g, const T* beta, const T* state0,
                            int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale) {
  const T sc = T(scale);
  const int64_t KV = Dk * Dv, B = 64;  // checkpoint every B tokens
  const int64_t NC = (Tn + B - 1) / B;
#pragma omp parallel for schedule(static) if (H > 1)
  for (int64_t h = 0; h < H; ++h) {
    const HeadView<T> hv{q + h * Dk, k + h * Dk, v + h * Dv, g + h * Dk, beta + h, H, Dk, Dv};
    // ckpt[c] = state before token c*B; seg[s] = state after token c*B + s - 1 (seg[0] = ckpt[c]).
    std::vector<T> ckpt((NC + 1) * KV, T(0)), seg((B + 1) * KV), dS(KV, T(0)), dSa(KV), du(Dv), ddl(Dv), u(Dv);
    if (state0) std::copy(state0 + h * KV, state0 + (h + 1) * KV, ckpt.begin());
    for (int64_t c = 0; c < NC; ++c) {
      std::copy(ckpt.begin() + c * KV, ckpt.begin() + (c + 1) * KV, ckpt.begin() + (c + 1) * KV);
      for (int64_t t = c * B; t < std::min(Tn, (c + 1) * B); ++t) step(ckpt.data() + (c + 1) * KV, hv, t);
    }
    if (dstate_final) std::copy(dstate_final + h * KV, dstate_final + (h + 1) * KV, dS.begin());
    for (int64_t c = NC - 1; c >= 0; --c) {
      const int64_t t0 = c * B, t1 = std::min(Tn, t0 + B);
      std::copy(ckpt.begin() + c * KV, ckpt.begin() + (c + 1) * KV, seg.begin());
      for (int64_t t = t0; t < t1; ++t) {
        std::copy(seg.begin() + (t - t0) * KV, seg.begin() + (t - t0 + 1) * KV, seg.begin() + (t - t0 + 1) * KV);
        step(seg.data() + (t - t0 + 1) * KV, hv, t);
      }
      for (int64_t t = t1 - 1; t >= t0; --t) {
        const T *Sp = seg.data() + (t - t0) * KV, *St = seg.data() + (t - t0 + 1) * KV;
        const T *qt = hv.qt(t), *kt = hv.kt(t), *vt = hv.vt(t), *gt = hv.gt(t), bt = hv.bt(t);
        const T* dot = do_ + (t * H + h) * Dv;
        T *dqt = dq + (t * H + h) * Dk, *dkt = dk + (t * H + h) * Dk, *dgt = dg + (t * H + h) * Dk;
        T* dvt = dv + (t * H + h) * Dv;
        // recompute u = (alpha S_prev)^T k
        std::fill(u.begin(), u.end(), T(0));
        for (int64_t i = 0; i < Dk; ++i) {
          const T a = std::exp(gt[i]);
          for (int64_t j = 0; j < Dv; ++j) u[j] += a * Sp[i * Dv + j] * kt[i];
        }
        // o = S_t^T (scale q):  dS += (scale q) do^T;  dq = scale S_t do
        for (int64_t i = 0; i < Dk; ++i) {
          T s = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            dS[i * Dv + j] += sc * qt[i] * dot[j];
            s += St[i * Dv + j] * dot[j];
          }
          dqt[i] = sc * s;
        }
        // S_t = S_a + k delta^T, delta = beta (v - u):  dS_a = dS;  dk = dS delta;  ddelta = dS^T k
        std::fill(ddl.begin(), ddl.end(), T(0));
        for (int64_t i = 0; i < Dk; ++i) {
          T s = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            s += dS[i * Dv + j] * bt * (vt[j] - u[j]);
            ddl[j] += dS[i * Dv + j] * kt[i];
          }
          dkt[i] = s;
        }
        // delta = beta (v - u):  dbeta = ddelta . (v - u);  dv = beta ddelta;  du = -beta ddelta
        T db = 0;
        for (int64_t j = 0; j < Dv; ++j) {
          db += ddl[j] * (vt[j] - u[j]);
          dvt[j] = bt * ddl[j];
          du[j] = -bt * ddl[j];
        }
        dbeta[t * H + h] = db;
        // u = S_a^T k:  dS_a += k du^T;  dk += S_a du
        // S_a = diag(alpha) S_prev:  dS_prev = diag(alpha) dS_a;  dg = alpha * rowsum(dS_a o S_prev)
        for (int64_t i = 0; i < Dk; ++i) {
          const T a = std::exp(gt[i]);
          T sk = 0, sg = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            const T dsa = dS[i * Dv + j] + kt[i] * du[j];
            sk += a * Sp[i * Dv + j] * du[j];
            sg += dsa * Sp[i * Dv + j];
            dSa[i * Dv + j] = a * dsa;
          }
          dkt[i] += sk;
          dgt[i] = a * sg;
        }
        std::swap(dS, dSa);
      }
    }
    if (dstate0) std::copy(dS.begin(), dS.end(), dstate0 + h * KV);
  }
}

template <typename T>
void kda_chunk_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* dstate0, const T* do_, const T* dstate_final,
                        const T* q, const T* k, const T* v, const T* g, const T* beta, const T* state0, int64_t Tn,
                        int64_t H, int64_t Dk, int64_t Dv, double scale, int64_t chunk) {
  K3_ASSERT(chunk >= 1, "kda_chunk_backward: chunk must be >= 1");
  const int64_t C = chunk, KV = Dk * Dv, NT = (Tn + C - 1) / C;
  const T sc = T(scale);
#pragma omp parallel for schedule(static) if (H > 1)
  for (int64_t h = 0; h < H; ++h) {
    std::vector<T> Q(C * Dk), K(C * Dk), G(C * Dk), V(C * Dv), E(C * Dk), Edl(C * Dk), Qe(C * Dk), Ke(C * Dk),
        Kd(C * Dk), El(Dk), bt(C);
    std::vector<T> Akk(C * C), Aqk(C * C), Linv(C * C), Tm(C * C), R(C * Dv), Vp(C * Dv), dO(C * Dv);
    std::vector<T> states((NT + 1) * KV, T(0)), dS(KV, T(0)), dSn(KV), dVp(C * Dv), dR(C * Dv), dT(C * C),
        dAqk(C * C), dLinv(C * C), M1(C * C), gL(C * C), dQ(C * Dk), dK(C * Dk), dG(C * Dk), dQe(C * Dk),
        dKe(C * Dk), dKd(C * Dk), dEl(Dk), db(C);
    // Chunk c's inputs, padded to nothing: L rows.
    auto load = [&](int64_t c, int64_t L) {
      const int64_t t0 = c * C;
      for (int64_t i = 0; i < L; ++i) {
        const int64_t ro = ((t0 + i) * H + h);
        for (int64_t d = 0; d < Dk; ++d) {
          Q[i * Dk + d] = sc * q[ro * Dk + d];
          K[i * Dk + d] = k[ro * Dk + d];
          G[i * Dk + d] = (i ? G[(i - 1) * Dk + d] : T(0)) + g[ro * Dk + d];  // G = cumsum g
        }
        for (int64_t j = 0; j < Dv; ++j) V[i * Dv + j] = v[ro * Dv + j];
        bt[i] = beta[ro];
      }
      const T* Gl = G.data() + (L - 1) * Dk;
      for (int64_t d = 0; d < Dk; ++d) El[d] = std::exp(Gl[d]);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < Dk; ++d) {
          E[i * Dk + d] = std::exp(G[i * Dk + d]);
          Edl[i * Dk + d] = std::exp(Gl[d] - G[i * Dk + d]);
          Qe[i * Dk + d] = Q[i * Dk + d] * E[i * Dk + d];
          Ke[i * Dk + d] = K[i * Dk + d] * E[i * Dk + d];
          Kd[i * Dk + d] = K[i * Dk + d] * Edl[i * Dk + d];
        }
      // Akk (j < i), Aqk (j <= i), pairwise decay e^(G_i - G_j)
      std::fill(Akk.begin(), Akk.end(), T(0));
      std::fill(Aqk.begin(), Aqk.end(), T(0));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          T a = 0, p = 0;
          for (int64_t d = 0; d < Dk; ++d) {
            const T kd = K[j * Dk + d] * std::exp(G[i * Dk + d] - G[j * Dk + d]);
            a += K[i * Dk + d] * kd;
            p += Q[i * Dk + d] * kd;
          }
          if (j < i) Akk[i * C + j] = a;
          Aqk[i * C + j] = p;
        }
      // Linv = (I + diag(beta) Akk)^-1 by forward substitution; Tm = Linv diag(beta)
      std::fill(Linv.begin(), Linv.end(), T(0));
      for (int64_t i = 0; i < L; ++i) {
        Linv[i * C + i] = 1;
        for (int64_t j = 0; j < i; ++j)
          for (int64_t m = 0; m <= j; ++m) Linv[i * C + m] -= bt[i] * Akk[i * C + j] * Linv[j * C + m];
      }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t m = 0; m < L; ++m) Tm[i * C + m] = Linv[i * C + m] * bt[m];
    };
    // Forward state pass: states[c] = state before chunk c; R and V' recomputed below.
    auto rv = [&](const T* S0, int64_t L) {
      // R = V - (K E) S0;  V' = Tm R
      std::copy(V.begin(), V.begin() + L * Dv, R.begin());
      gemm(false, false, L, Dv, Dk, T(-1), Ke.data(), Dk, S0, Dv, T(1), R.data(), Dv);
      gemm(false, false, L, Dv, L, T(1), Tm.data(), C, R.data(), Dv, T(0), Vp.data(), Dv);
    };
    if (state0) std::copy(state0 + h * KV, state0 + (h + 1) * KV, states.begin());
    for (int64_t c = 0; c < NT; ++c) {
      const int64_t L = std::min(C, Tn - c * C);
      load(c, L);
      const T* S0 = states.data() + c * KV;
      T* S1 = states.data() + (c + 1) * KV;
      rv(S0, L);
      // S1 = diag(El) S0 + Kd^T V'
      for (int64_t d = 0; d < Dk; ++d)
        for (int64_t j = 0; j < Dv; ++j) S1[d * Dv + j] = El[d] * S0[d * Dv + j];
      gemm(true, false, Dk, Dv, L, T(1), Kd.data(), Dk, Vp.data(), Dv, T(1), S1, Dv);
    }
    if (dstate_final) std::copy(dstate_final + h * KV, dstate_final + (h + 1) * KV, dS.begin());
    for (int64_t c = NT - 1; c >= 0; --c) {
      const int64_t t0 = c * C, L = std::min(C, Tn - t0);
      load(c, L);
      const T* S0 = states.data() + c * KV;
      rv(S0, L);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < Dv; ++j) dO[i * Dv + j] = do_[((t0 + i) * H + h) * Dv + j];
      // S1 = diag(El) S0 + Kd^T V':  dV' = Kd dS;  dKd = V' dS^T;  dS0 = diag(El) dS;  dEl = rowsum(dS o S0)
      gemm(false, false, L, Dv, Dk, T(1), Kd.data(), Dk, dS.data(), Dv, T(0), dVp.data(), Dv);
      gemm(false, true, L, Dk, Dv, T(1), Vp.data(), Dv, dS.data(), Dv, T(0), dKd.data(), Dk);
      for (int64_t d = 0; d < Dk; ++d) {
        T s = 0;
        for (int64_t j = 0; j < Dv; ++j) {
          dSn[d * Dv + j] = El[d] * dS[d * Dv + j];
          s += dS[d * Dv + j] * S0[d * Dv + j];
        }
        dEl[d] = s;
      }
      // O = (Q E) S0 + Aqk V':  dQe = dO S0^T;  dS0 += (Q E)^T dO;  dAqk = Mask(dO V'^T);  dV' += Aqk^T dO
      gemm(false, true, L, Dk, Dv, T(1), dO.data(), Dv, S0, Dv, T(0), dQe.data(), Dk);
      gemm(true, false, Dk, Dv, L, T(1), Qe.data(), Dk, dO.data(), Dv, T(1), dSn.data(), Dv);
      gemm(false, true, L, L, Dv, T(1), dO.data(), Dv, Vp.data(), Dv, T(0), dAqk.data(), C);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = i + 1; j < L; ++j) dAqk[i * C + j] = 0;
      gemm(true, false, L, Dv, L, T(1), Aqk.data(), C, dO.data(), Dv, T(1), dVp.data(), Dv);
      // V' = Tm R:  dR = Tm^T dV';  dTm = dV' R^T
      gemm(true, false, L, Dv, L, T(1), Tm.data(), C, dVp.data(), Dv, T(0), dR.data(), Dv);
      gemm(false, true, L, L, Dv, T(1), dVp.data(), Dv, R.data(), Dv, T(0), dT.data(), C);
      // R = V - (K E) S0:  dV = dR;  dKe = -dR S0^T;  dS0 -= (K E)^T dR
      gemm(false, true, L, Dk, Dv, T(-1), dR.data(), Dv, S0, Dv, T(0), dKe.data(), Dk);
      gemm(true, false, Dk, Dv, L, T(-1), Ke.data(), Dk, dR.data(), Dv, T(1), dSn.data(), Dv);
      // Tm = Linv diag(beta):  dLinv = dTm diag(beta);  dbeta_j = sum_i dTm_ij Linv_ij
      std::fill(db.begin(), db.end(), T(0));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          dLinv[i * C + j] = dT[i * C + j] * bt[j];
          db[j] += dT[i * C + j] * Linv[i * C + j];
        }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = i + 1; j < L; ++j) dLinv[i * C + j] = 0;
      // Linv = L^-1:  dL = -Linv^T dLinv Linv^T;  L = I + diag(beta) Akk:  dAkk = diag(beta) dL, dbeta_i += dL_i . Akk_i
      gemm(true, false, L, L, L, T(1), Linv.data(), C, dLinv.data(), C, T(0), M1.data(), C);
      gemm(false, true, L, L, L, T(-1), M1.data(), C, Linv.data(), C, T(0), gL.data(), C);
      std::fill(dQ.begin(), dQ.end(), T(0));
      std::fill(dK.begin(), dK.end(), T(0));
      std::fill(dG.begin(), dG.end(), T(0));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const T dakk = j < i ? bt[i] * gL[i * C + j] : T(0), daqk = dAqk[i * C + j];
          if (j < i) db[i] += gL[i * C + j] * Akk[i * C + j];
          // Akk_ij = sum_d K_i K_j e^(G_i - G_j);  Aqk_ij = sum_d Q_i K_j e^(G_i - G_j)
          for (int64_t d = 0; d < Dk; ++d) {
            const T e = std::exp(G[i * Dk + d] - G[j * Dk + d]);
            const T ki = K[i * Dk + d], kj = K[j * Dk + d], qi = Q[i * Dk + d];
            dK[i * Dk + d] += dakk * kj * e;
            dK[j * Dk + d] += (dakk * ki + daqk * qi) * e;
            dQ[i * Dk + d] += daqk * kj * e;
            const T t = (dakk * ki + daqk * qi) * kj * e;
            dG[i * Dk + d] += t;
            dG[j * Dk + d] -= t;
          }
        }
      // Qe = Q E, Ke = K E, Kd = K e^(G_last - G), El = e^G_last
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < Dk; ++d) {
          const int64_t x = i * Dk + d;
          dQ[x] += dQe[x] * E[x];
          dK[x] += dKe[x] * E[x] + dKd[x] * Edl[x];
          dG[x] += dQe[x] * Qe[x] + dKe[x] * Ke[x] - dKd[x] * Kd[x];
          dG[(L - 1) * Dk + d] += dKd[x] * Kd[x];
        }
      for (int64_t d = 0; d < Dk; ++d) dG[(L - 1) * Dk + d] += dEl[d] * El[d];
      // G = cumsum g:  dg = reverse cumsum of dG;  Q = scale q
      for (int64_t i = L - 2; i >= 0; --i)
        for (int64_t d = 0; d < Dk; ++d) dG[i * Dk + d] += dG[(i + 1) * Dk + d];
      for (int64_t i = 0; i < L; ++i) {
        const int64_t ro = (t0 + i) * H + h;
        for (int64_t d = 0; d < Dk; ++d) {
          dq[ro * Dk + d] = sc * dQ[i * Dk + d];
          dk[ro * Dk + d] = dK[i * Dk + d];
          dg[ro * Dk + d] = dG[i * Dk + d];
        }
        for (int64_t j = 0; j < Dv; ++j) dv[ro * Dv + j] = dR[i * Dv + j];
        dbeta[ro] = db[i];
      }
      std::swap(dS, dSn);
    }
    if (dstate0) std::copy(dS.begin(), dS.end(), dstate0 + h * KV);
  }
}

#define K3_KDA_BWD_INST(T)                                                                                        \
  template void kda_recurrent_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*,        \
                                          const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,     \
                                          int64_t, double);                                                     \
  template void kda_chunk_backward<T>(T*, T*, T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                      const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, double,  \
                                      int64_t);
K3_KDA_BWD_INST(float)
K3_KDA_BWD_INST(double)
#undef K3_KDA_BWD_INST

}  // namespace k3
