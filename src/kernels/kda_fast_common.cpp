// Fast chunked KDA, the parts shared by forward and backward (kda_fast_impl.h): workspace,
// vectorised exp, chunk preparation with the tile anchors, the intra-chunk tiles (dense, or
// safe on the diagonal) and the UT transform. docs/model.md section 3, "Chunkwise form".
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kda_fast_impl.h"


namespace k3 {
namespace kda_fast {

AlignedBuf::~AlignedBuf() { aligned_free64(p_); }
AlignedBuf& AlignedBuf::operator=(AlignedBuf&& o) noexcept {
  if (this != &o) {
    aligned_free64(p_);
    p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}
void AlignedBuf::reserve(size_t bytes) {
  if (bytes <= n_) return;
  aligned_free64(p_);
  p_ = nullptr, n_ = 0;
  p_ = aligned_alloc64(bytes);
  n_ = bytes;
}

Geom make_geom(int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt) {
  K3_ASSERT(opt.chunk >= kTile && opt.chunk <= 128 && opt.chunk % kTile == 0,
            "KDAFastOptions.chunk must be a multiple of 16 in [16, 128]");
  K3_ASSERT(Tn >= 0 && H >= 1 && Dk >= 1 && Dv >= 1, "kda fast: bad dimensions");
  Geom g{};
  g.Tn = Tn, g.H = H, g.Dk = Dk, g.Dv = Dv, g.C = opt.chunk, g.NB = opt.chunk / kTile;
  g.NT = (Tn + g.C - 1) / g.C;
  g.Dkp = round_up(Dk, 16), g.Dvp = round_up(Dv, 16);
  g.scale = float(scale);
  g.bf16 = opt.bf16;
  g.dense = kda_fast_diag_path(opt) == KDAFastOptions::DiagPath::Dense;
  g.stream = Tn * H * std::max(Dk, Dv) * 4 >= (int64_t(32) << 20);  // beyond the 32 MB L3
  return g;
}

void Scratch::carve(const Geom& g) {
  const int64_t C = g.C, CK = C * g.Dkp, CV = C * g.Dvp, KV = g.Dkp * g.Dvp, CC = C * C, Kp = g.Dkp;
  const int64_t TBn = std::max({KV, CV, CC});
  float** f32s[] = {&Q, &K, &G, &E, &Edl, &Ga, &Kd, &Y, &Ex, &Ey, &YT, &dKd, &dY, &dG};
  float** f32d[] = {&KQe, &XQ, &dKQe, &dXQ};  // 2C x Dkp
  float** cc[] = {&Akk, &Aqk, &Linv, &Tm, &dT, &dAqk, &dLinv, &M1, &dL, &LT};
  float** cv[] = {&R, &Vp, &dVp};

  // bf16 operand buffers, in uint16 units: A up to 2C x max(Dkp, Dvp) (or its transpose), B up
  // to max(Dkp x Dvp, 2C x Dvp, Dkp x C, C x C) plus a pad pair-row.
  const int64_t HA = std::max({2 * CK, 2 * CV, CC, 32 * Kp}), HB = std::max({KV, 2 * CV, CK, CC}) + 2 * std::max(Kp, g.Dvp);
  size_t nf = 14 * CK + 4 * 2 * CK + 10 * CC + 4 * CV;
  nf += 2 * CV + 2 * CV + TBn + 2 * C * C;  // P, G2, TB, dAA
  nf += 36 * Kp + 3 * Kp + 32 * C + Kp + 2 * C + 64;  // Asc, f, El, dEl, Ct, vec, beta, dbeta, slack
  const size_t nh = HA + 2 * HB + (CK + 2 * Kp) + (2 * CK + 2 * Kp);
  // every buffer starts on a 64-byte boundary
  const size_t nbuf = 64;
  mem.reserve((nf + nh / 2 + 2 * nbuf * 16) * sizeof(float));
  char* p = mem.as<char>();
  auto take = [&](size_t bytes) {
    char* r = p;
    p += (bytes + 63) / 64 * 64;
    return r;
  };
  auto tf = [&](int64_t n) { return reinterpret_cast<float*>(take(size_t(n) * 4)); };
  auto th = [&](int64_t n) { return reinterpret_cast<uint16_t*>(take(size_t(n) * 2)); };
  for (auto pp : f32s) *pp = tf(CK);
  for (auto pp : f32d) *pp = tf(2 * CK);
  for (auto pp : cc) *pp = tf(CC);
  for (auto pp : cv) *pp = tf(CV);
  P = tf(2 * CV), G2 = tf(2 * CV), TB = tf(TBn), dAA = tf(2 * C * C);
  tmp = tf(4 * Kp), Asc = tf(32 * Kp), f = tf(Kp), El = tf(Kp), dEl = tf(Kp), Ct = tf(32 * C), vec = tf(Kp), beta = tf(C),
  dbeta = tf(C);
  ha = th(HA), hb1 = th(HB), hb2 = th(HB), hY = th(CK + 2 * Kp), hXQ = th(2 * CK + 2 * Kp);
  K3_ASSERT(size_t(p - mem.as<char>()) <= mem.bytes(), "kda fast: scratch carve overflow");
}

// ---------------------------------------------------------------------------------------
// chunk preparation

namespace {

// One gathered row: Q = sc q, K = k, G = Gp + g (Gp null: first row), zero padding to Kp.
inline void gather_row(float* __restrict Qi, float* __restrict Ki, float* __restrict Gi, const float* __restrict Gp,
                       const float* __restrict qi, const float* __restrict ki, const float* __restrict gi, float sc,
                       int64_t Dk, int64_t Kp) {
#pragma omp simd
  for (int64_t c = 0; c < Dk; ++c) {
    Qi[c] = sc * qi[c];
    Ki[c] = ki[c];
  }
  if (Gp) {
#pragma omp simd
    for (int64_t c = 0; c < Dk; ++c) Gi[c] = Gp[c] + gi[c];
  } else {
#pragma omp simd
    for (int64_t c = 0; c < Dk; ++c) Gi[c] = gi[c];
  }
  for (int64_t c = Dk; c < Kp; ++c) Qi[c] = Ki[c] = Gi[c] = 0.f;
}

}  // namespace

void prep_chunk(const Geom& gm, Scratch& s, const float* q, const float* k, const float* v, const float* g,
                const float* beta, int64_t h, int64_t t0, int64_t n, bool prefetch_v, bool keep_factors) {
  constexpr int64_t kAhead = 8;
  const int64_t C = gm.C, Dk = gm.Dk, Dv = gm.Dv, Kp = gm.Dkp, H = gm.H;
  const int64_t ldk = H * Dk, ldv = H * Dv;
  const float sc = gm.scale;
  for (int64_t i = 0; i < C; ++i) {
    float *Qi = s.Q + i * Kp, *Ki = s.K + i * Kp, *Gi = s.G + i * Kp;
    const float* Gp = i ? Gi - Kp : nullptr;
    if (i + kAhead < n) {  // rows are strided by H*D: fetch a few rows ahead into L1
      const int64_t ta = t0 + i + kAhead;
      for (int64_t c = 0; c < Dk; c += 16) {
        __builtin_prefetch(q + ta * ldk + h * Dk + c);
        __builtin_prefetch(k + ta * ldk + h * Dk + c);
        __builtin_prefetch(g + ta * ldk + h * Dk + c);
      }
      if (prefetch_v)
        for (int64_t c = 0; c < Dv; c += 16) __builtin_prefetch(v + ta * ldv + h * Dv + c);
    }
    if (i < n) {
      const float* gi = g + (t0 + i) * ldk + h * Dk;
      gather_row(Qi, Ki, Gi, Gp, q + (t0 + i) * ldk + h * Dk, k + (t0 + i) * ldk + h * Dk, gi, sc, Dk, Kp);
      if (!gm.dense) {  // e^g per token for the Safe diagonal tiles (padding: e^0)
        vexp(s.Ga + i * Kp, gi, Dk);
        for (int64_t c = Dk; c < Kp; ++c) s.Ga[i * Kp + c] = 1.f;
      }
      s.beta[i] = beta[(t0 + i) * H + h];
    } else {
      std::fill(Qi, Qi + Kp, 0.f);
      std::fill(Ki, Ki + Kp, 0.f);
      if (Gp)
        std::memcpy(Gi, Gp, size_t(Kp) * 4);
      else
        std::fill(Gi, Gi + Kp, 0.f);
      if (!gm.dense) std::fill(s.Ga + i * Kp, s.Ga + (i + 1) * Kp, 1.f);
      s.beta[i] = 0.f;
    }
  }
  // Second pass, row by row (G_last and the anchors are known now): decay factors, kept
  // only when the backward needs them, and the scaled operands.
  const float* Gl = s.G + (C - 1) * Kp;
  vexp(s.El, Gl, Kp);
  for (int64_t i = 0; i < C; ++i) {
    const int64_t I = i / kTile, il = i % kTile, r = anchor_row(gm, I), cc = anchor_col(gm, I);
    const float *Gi = s.G + i * Kp, *Qi = s.Q + i * Kp, *Ki = s.K + i * Kp, *Gc = s.G + cc * Kp;
    const float* Gr = r >= 0 ? s.G + r * Kp : nullptr;  // r = -1: the chunk start, G = 0
    float* E = keep_factors ? s.E + i * Kp : nullptr;
    float* Edl = keep_factors ? s.Edl + i * Kp : nullptr;
    float* Ex = keep_factors ? s.Ex + i * Kp : nullptr;
    float* Ey = keep_factors ? s.Ey + i * Kp : nullptr;
    // K E, Q E, K e^(G_last - G);  anchored X = K e^(G - G_r), Qx = Q e^(G - G_r), Y = K e^(G_c - G)
    float *Ke = s.KQe + i * Kp, *Qe = s.KQe + (C + i) * Kp, *Kd = s.Kd + i * Kp;
    float *X = s.XQ + (I * 2 * kTile + il) * Kp, *Qx = X + kTile * Kp, *Y = s.Y + i * Kp;
    prep_row(Gi, Ki, Qi, Gl, Gr, Gc, Ke, Qe, Kd, X, Qx, Y, E, Edl, Ex, Ey, Kp);
  }
}

void tile_factor(const Geom& gm, const Scratch& s, int64_t I, int64_t J, float* f) {
  const int64_t Kp = gm.Dkp, r = anchor_row(gm, I), c = anchor_col(gm, J);
  const float *Gr = s.G + r * Kp, *Gc = s.G + c * Kp;
  float* t = s.vec;
#pragma omp simd
  for (int64_t d = 0; d < Kp; ++d) t[d] = Gr[d] - Gc[d];
  vexp(f, t, Kp);
}

static inline float dot(const float* a, const float* b, int64_t n) {
  float r = 0;
#pragma omp simd reduction(+ : r)
  for (int64_t i = 0; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Safe path, diagonal tile I: pair (i, j), j <= i, from y = K_j prod_{t=j+1..i} e^g_t (<= 1).
static void diag_tile_safe(const Geom& gm, Scratch& s, int64_t I) {
  const int64_t Kp = gm.Dkp, C = gm.C;
  float* y = s.vec;
  for (int64_t jl = 0; jl < kTile; ++jl) {
    const int64_t j = I * kTile + jl;
    std::memcpy(y, s.K + j * Kp, size_t(Kp) * 4);
    s.Aqk[j * C + j] = dot(s.Q + j * Kp, y, Kp);
    for (int64_t i = j + 1; i < (I + 1) * kTile; ++i) {
      const float* a = s.Ga + i * Kp;
#pragma omp simd
      for (int64_t c = 0; c < Kp; ++c) y[c] *= a[c];
      s.Akk[i * C + j] = dot(s.K + i * Kp, y, Kp);
      s.Aqk[i * C + j] = dot(s.Q + i * Kp, y, Kp);
    }
  }
}

void intra_chunk(const Geom& gm, Scratch& s) {
  const int64_t C = gm.C, Kp = gm.Dkp;
  std::memset(s.Akk, 0, size_t(C * C) * 4);
  std::memset(s.Aqk, 0, size_t(C * C) * 4);
  for (int64_t I = 0; I < gm.NB; ++I) {
    // Row block I: [Akk_I,0..J ; Aqk_I,0..J] = [X_I ; Qx_I] [Y_0 f_I0 | ... | Y_J f_IJ]^T, with
    // f_II = 1 (Dense: the diagonal tile goes through the same product) and J = I - 1 (Safe).
    const int64_t nJ = gm.dense ? I + 1 : I;
    if (nJ > 0) {
      BOp b;
      for (int64_t J = 0; J < nJ; ++J) {
        const float* f = nullptr;
        if (J < I) {
          tile_factor(gm, s, I, J, s.f);
          f = s.f;
        }
        if (gm.bf16)
          pack_vnni_t(s.hb2 + 2 * J * kTile, C, s.Y + J * kTile * Kp, Kp, Kp, kTile, f);
        else
          transpose_f32(s.YT + J * kTile, C, s.Y + J * kTile * Kp, Kp, kTile, Kp, f);
      }
      if (gm.bf16)
        b.h = s.hb2, b.ldh = C;
      else
        b.f = s.YT, b.ldb = C;
      const AOp a = a_op(gm.bf16, s.XQ + I * 2 * kTile * Kp, Kp, false, 2 * kTile, Kp, s.ha);
      mm(s.Ct, C, a, b, 2 * kTile, nJ * kTile, Kp, 1.f, false);
      for (int64_t r = 0; r < kTile; ++r) {
        const int64_t i = I * kTile + r;
        const int64_t nk = gm.dense ? i : I * kTile, nq = gm.dense ? i + 1 : I * kTile;  // causal masks
        const float *ck = s.Ct + r * C, *cq = s.Ct + (kTile + r) * C;
        float *ak = s.Akk + i * C, *aq = s.Aqk + i * C;
        for (int64_t j = 0; j < nk; ++j) ak[j] = ck[j];
        for (int64_t j = 0; j < nq; ++j) aq[j] = cq[j];
      }
    }
    if (!gm.dense) diag_tile_safe(gm, s, I);
  }
}

void ut_transform(const Geom& gm, Scratch& s, const float* Akk) {
  const int64_t C = gm.C;
  ut_rows(s.Linv, Akk, s.beta, C);
  for (int64_t i = 0; i < C; ++i)
#pragma omp simd
    for (int64_t m = 0; m < C; ++m) s.Tm[i * C + m] = s.Linv[i * C + m] * s.beta[m];
}

// ---------------------------------------------------------------------------------------
// operands

AOp a_op(bool bf16, const float* src, int64_t lds, bool trans, int64_t M, int64_t K, uint16_t* hbuf,
         const float* colscale, float* fbuf) {
  AOp a;
  K3_ASSERT(!(trans && colscale), "a_op: column scale of a transposed operand");
  if (!bf16) {
    if (!colscale) {
      a.f = src, a.lda = lds, a.trans = trans;
      return a;
    }
    for (int64_t i = 0; i < M; ++i)
#pragma omp simd
      for (int64_t c = 0; c < K; ++c) fbuf[i * K + c] = src[i * lds + c] * colscale[c];
    a.f = fbuf, a.lda = K;
    return a;
  }
  K3_ASSERT(K % 2 == 0, "a_op: bf16 operand needs an even inner dimension");
  if (trans)
    to_bf16_t(hbuf, K, src, lds, K, M);
  else
    to_bf16(hbuf, K, src, lds, M, K, colscale);
  a.h = hbuf, a.ldh = K;
  return a;
}

BOp b_op(bool bf16, const float* src, int64_t lds, bool trans, int64_t K, int64_t N, uint16_t* hbuf, float* fbuf) {
  BOp b;
  if (!bf16) {
    if (!trans) {
      b.f = src, b.ldb = lds;
    } else {
      transpose_f32(fbuf, N, src, lds, N, K);
      b.f = fbuf, b.ldb = N;
    }
    return b;
  }
  if (trans)
    pack_vnni_t(hbuf, N, src, lds, K, N);
  else
    pack_vnni(hbuf, N, src, lds, K, N);
  b.h = hbuf, b.ldh = N;
  return b;
}

void mm(float* C, int64_t ldc, const AOp& a, const BOp& b, int64_t M, int64_t N, int64_t K, float alpha,
        bool accumulate, Tri tri, const float* colscale) {
  if (a.h) {
    K3_ASSERT(b.h != nullptr, "kda fast: bf16 A with f32 B");
    mm_bf16(C, ldc, a.h, a.ldh, b.h, b.ldh, M, N, K, alpha, accumulate, tri, colscale);
  } else {
    K3_ASSERT(b.f != nullptr, "kda fast: f32 A with bf16 B");
    mm_f32(C, ldc, a.f, a.lda, a.trans, b.f, b.ldb, M, N, K, alpha, accumulate, tri, colscale);
  }
}

}  // namespace kda_fast

// ---------------------------------------------------------------------------------------
// public odds and ends

KDAFastOptions::DiagPath kda_fast_diag_path(const KDAFastOptions& opt) {
  if (opt.diag != KDAFastOptions::DiagPath::Auto) return opt.diag;
  return opt.gate_bounded ? KDAFastOptions::DiagPath::Dense : KDAFastOptions::DiagPath::Safe;
}

KDAWorkspace::KDAWorkspace() : impl_(std::make_unique<Impl>()) {}
KDAWorkspace::~KDAWorkspace() = default;
KDAWorkspace::KDAWorkspace(KDAWorkspace&&) noexcept = default;
KDAWorkspace& KDAWorkspace::operator=(KDAWorkspace&&) noexcept = default;
bool KDAWorkspace::has_saved() const { return impl_->saved; }
size_t KDAWorkspace::bytes() const {
  size_t n = impl_->states.bytes() + impl_->rv.bytes() + impl_->aa.bytes();
  for (auto& t : impl_->threads) n += t.mem.bytes() + t.heads.bytes();
  return n;
}
void KDAWorkspace::release() { impl_ = std::make_unique<Impl>(); }

void KDAWorkspace::Impl::prepare_threads(const kda_fast::Geom& g) {
  const int nt = std::max(1, omp_get_max_threads());
  if (int(threads.size()) < nt) threads.resize(nt);
  for (auto& t : threads) t.carve(g);
}

void KDAWorkspace::Impl::prepare_saved(const kda_fast::Geom& g) {
  saved_geom = g;
  states.reserve(size_t(g.H * g.NT * g.Dkp * g.Dvp) * 4);
  rv.reserve(size_t(g.H * g.NT * 2 * g.C * g.Dvp) * 4);
  aa.reserve(size_t(g.H * g.NT * 2 * g.C * g.C) * 4);
}

double kda_chunk_fast_flops(int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, int64_t chunk, bool backward) {
  const double C = double(chunk), NB = C / 16, NT = double((Tn + chunk - 1) / chunk), dk = double(Dk),
               dv = double(Dv);
  const double tiles = NB * (NB + 1) / 2 * 2 * 32 * 16 * dk;  // [Akk ; Aqk] tiles
  const double tri = C * (C + 16) / 2;                       // lower C x C at 16-row granularity
  double per = tiles + 2 * (2 * C) * dk * dv                 // [K E ; Q E] S
               + 2 * tri * dv * 2                            // V' = Tm R, Aqk V'
               + 2 * dk * dv * C;                            // Kd^T V'
  if (backward) {
    per = 2 * C * dk * dv + 2 * tri * dv        // dV' = Kd dS + Aqk^T dO
          + 2 * tri * dv                        // dR = Tm^T dV'
          + 2 * (2 * C) * dv * dk               // [-dR ; dO] S0^T
          + 2 * C * dv * dk                     // dKd = V' dS^T
          + 2 * 2 * NB * (NB + 1) / 2 * 256 * dv  // dT, dAqk (lower row blocks)
          + 2 * dk * dv * 2 * C                 // dS0 += [K E ; Q E]^T [-dR ; dO]
          + 2 * 2 * C * C * C                   // UT backward
          + 2 * tiles;                          // tile gradients
  }
  return per * NT * double(H);
}

}  // namespace k3
