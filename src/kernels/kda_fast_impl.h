// Internals of the fast chunked KDA kernel (kda_fast.h), shared by its forward and backward
// files: the workspace layout, the per-chunk preparation (gather, cumulative decay, anchored
// operands), the intra-chunk tiles, the UT transform, and the operand wrappers that let one
// code path run its products in f32 or bf16. Not a public API.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kda_fast.h"
#include "kernels/matmul_bf16.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace k3::kda_fast {

constexpr int64_t kTile = 16;  // sub-tile size (docs/model.md section 3)

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Flush-to-zero and denormals-are-zero for this thread while alive (restored after). Decays of
// e^-5 per token drive state entries through the subnormal range, where this CPU's FMAs take
// a slow path (the decode loop runs 4x slower); values below 1.2e-38 carry no information here.
class FlushDenormals {
 public:
#if defined(__SSE__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// 64-byte aligned, uninitialised, move-only.
class AlignedBuf {
 public:
  AlignedBuf() = default;
  ~AlignedBuf();
  AlignedBuf(AlignedBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  AlignedBuf& operator=(AlignedBuf&& o) noexcept;
  void reserve(size_t bytes);  // grows (contents lost), never shrinks
  size_t bytes() const { return n_; }
  template <typename T> T* as() { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Problem shape with padded widths (Dkp, Dvp multiples of 16) and the resolved options.
struct Geom {
  int64_t Tn, H, Dk, Dv, C, NB, NT, Dkp, Dvp;
  float scale;
  bool bf16, dense;
  bool stream;  // outputs too large to stay cached: written with non-temporal stores
  bool same(const Geom& o) const {
    return Tn == o.Tn && H == o.H && Dk == o.Dk && Dv == o.Dv && C == o.C && bf16 == o.bf16 && dense == o.dense;
  }
};
Geom make_geom(int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt);

// Per-thread scratch, carved from one allocation. Shapes in comments (rows x cols, row-major).
struct Scratch {
  // chunk inputs and decay
  float *Q, *K, *G, *beta;  // Q = scale q, G = cumsum g: C x Dkp; beta: C
  float *E, *Edl, *Ga, *El;     // e^G, e^(G_last - G), e^g (Safe path): C x Dkp; El: Dkp
  float *KQe, *Kd;              // [K E ; Q E]: 2C x Dkp; K e^(G_last - G): C x Dkp
  float *XQ, *Y, *Ex, *Ey;      // per block I: [X_I ; Qx_I] (32 x Dkp), Y, anchor factors: C x Dkp
  float *YT, *Asc, *f, *Ct, *vec, *tmp;  // Y^T: Dkp x C; 32 x Dkp; f: Dkp; tiles 32 x C; rows
  // chunk matrices
  float *Akk, *Aqk, *Linv, *Tm;  // C x C
  float *P, *R, *Vp;             // P: 2C x Dvp ([K E S ; Q E S]); R, V': C x Dvp
  // backward
  float *G2, *dVp, *TB;             // [-dR ; dO]: 2C x Dvp; dV': C x Dvp; TB: transposes
  float *dT, *dAqk, *dLinv, *M1, *dL, *LT, *dAA;  // C x C (dAA: NB blocks of 32 x C)
  float *dKQe, *dKd, *dXQ, *dY, *dG, *dEl, *dbeta;  // 2C x Dkp, C x Dkp, 2C x Dkp, C x Dkp, C x Dkp, Dkp, C
  // bf16 operands
  uint16_t *ha, *hb1, *hb2, *hY, *hXQ;
  AlignedBuf mem;
  AlignedBuf heads;  // per-head states (forward) or state gradients (backward) of the group
  void carve(const Geom& g);
};

}  // namespace k3::kda_fast

namespace k3 {

struct KDAWorkspace::Impl {
  std::vector<kda_fast::Scratch> threads;
  // Saved by a forward with save_for_backward: per head h and chunk c (padded widths),
  // the state at the chunk start [Dkp, Dvp], R and V' [C, Dvp], Akk and Aqk [C, C].
  kda_fast::AlignedBuf states, rv, aa;
  kda_fast::Geom saved_geom{};
  bool saved = false;
  float* state_at(int64_t h, int64_t c) {
    const auto& g = saved_geom;
    return states.as<float>() + (h * g.NT + c) * g.Dkp * g.Dvp;
  }
  float* r_at(int64_t h, int64_t c) {
    const auto& g = saved_geom;
    return rv.as<float>() + ((h * g.NT + c) * 2) * g.C * g.Dvp;
  }
  float* vp_at(int64_t h, int64_t c) { return r_at(h, c) + saved_geom.C * saved_geom.Dvp; }
  float* akk_at(int64_t h, int64_t c) {
    const auto& g = saved_geom;
    return aa.as<float>() + ((h * g.NT + c) * 2) * g.C * g.C;
  }
  float* aqk_at(int64_t h, int64_t c) { return akk_at(h, c) + saved_geom.C * saved_geom.C; }
  void prepare_threads(const kda_fast::Geom& g);
  void prepare_saved(const kda_fast::Geom& g);
};

}  // namespace k3

namespace k3::kda_fast {

// The vector pieces, one copy per SIMD target (kda_fast_simd.cpp).
// dst[i] = e^src[i] (inf above ~88.7, 0 below -88, NaN kept).
void vexp(float* dst, const float* src, int64_t n);
// dst[i] = alpha * src[i], n values (vector stores: the token-major outputs are strided rows);
// stream: non-temporal stores where dst is 64-byte aligned (no read-for-ownership of lines that
// are only written; call store_fence() before the data is read by another thread).
void store_row(float* __restrict dst, const float* __restrict src, int64_t n, float alpha = 1.f,
               bool stream = false);
void store_fence();
// One row of prep_chunk's decay factors (see prep_chunk); E, Edl, Ex, Ey null unless kept;
// Gr null means the chunk start (factor e^G). Kp a multiple of 16.
void prep_row(const float* Gi, const float* Ki, const float* Qi, const float* Gl, const float* Gr, const float* Gc,
              float* Ke, float* Qe, float* Kd, float* X, float* Qx, float* Y, float* E, float* Edl, float* Ex,
              float* Ey, int64_t Kp);
// Linv [C, C] = (I + diag(beta) Akk)^-1 by forward substitution (Akk strictly lower).
void ut_rows(float* Linv, const float* Akk, const float* beta, int64_t C);
// The decode step of one head given a = e^g and q.k: o = scale (S^T (a o q) + (q.k) d) with
// d = beta (v - S^T (a o k)), then S = diag(a) S + k d^T (S [Dk, Dv] updated in place).
void decode_head_update(float* o, float* S, const float* q, const float* k, const float* v, const float* a, float b,
                        float qk, float sc, int64_t Dk, int64_t Dv);
// Prefetch n floats starting at p into cache.
inline void prefetch_floats(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 2);
}

// Loads chunk rows [t0, t0 + n) of head h into the scratch (zero rows and columns as
// padding, g = 0 there) and forms G, El, KQe, Kd, anchored XQ and Y (and Ga for the Safe
// path). prefetch_v: also prefetch the rows of v (the forward reads them right after). keep_factors: also keep E, Edl, Ex, Ey (the backward's).
void prep_chunk(const Geom& gm, Scratch& s, const float* q, const float* k, const float* v, const float* g,
                const float* beta, int64_t h, int64_t t0, int64_t n, bool prefetch_v, bool keep_factors);
// Anchor rows of block I: row side rI, column side cI (index -1 means the chunk start, G = 0).
inline int64_t anchor_row(const Geom& gm, int64_t I) { return gm.dense ? I * kTile + kTile / 2 : I * kTile - 1; }
inline int64_t anchor_col(const Geom& gm, int64_t I) { return gm.dense ? I * kTile + kTile / 2 : I * kTile + kTile - 1; }
// f[d] = e^(G[rI] - G[cJ]) for the off-diagonal tile (I, J), J < I.
void tile_factor(const Geom& gm, const Scratch& s, int64_t I, int64_t J, float* f);
// Akk (strict lower), Aqk (lower, diagonal included), C x C, zero above, into s.Akk, s.Aqk.
void intra_chunk(const Geom& gm, Scratch& s);
// Linv = (I + diag(beta) Akk)^-1, Tm = Linv diag(beta) (into s.Linv, s.Tm).
void ut_transform(const Geom& gm, Scratch& s, const float* Akk);

// Product operands: f32 views, or bf16 copies packed into scratch.
struct AOp {
  const float* f = nullptr;
  int64_t lda = 0;
  bool trans = false;
  const uint16_t* h = nullptr;
  int64_t ldh = 0;
};
struct BOp {
  const float* f = nullptr;
  int64_t ldb = 0;
  const uint16_t* h = nullptr;
  int64_t ldh = 0;
};
// A (M x K): A(i, k) = src[i*lds + k], or src[k*lds + i] when trans. colscale scales A's
// columns (f32 mode: into fbuf).
AOp a_op(bool bf16, const float* src, int64_t lds, bool trans, int64_t M, int64_t K, uint16_t* hbuf,
         const float* colscale = nullptr, float* fbuf = nullptr);
// B (K x N): B(k, n) = src[k*lds + n], or src[n*lds + k] when trans (f32 mode: into fbuf).
BOp b_op(bool bf16, const float* src, int64_t lds, bool trans, int64_t K, int64_t N, uint16_t* hbuf,
         float* fbuf = nullptr);
// The sub-operand starting at row k0 of B (k0 even) and column n0.
inline BOp b_sub(const BOp& b, int64_t k0, int64_t n0) {
  BOp r = b;
  if (b.f) r.f = b.f + k0 * b.ldb + n0;
  if (b.h) r.h = b.h + (k0 / 2) * 2 * b.ldh + 2 * n0;
  return r;
}
void mm(float* C, int64_t ldc, const AOp& a, const BOp& b, int64_t M, int64_t N, int64_t K, float alpha,
        bool accumulate, Tri tri = Tri::None, const float* colscale = nullptr);

// Heads of thread t of nt: [h0, h1).
inline void head_range(int64_t H, int t, int nt, int64_t* h0, int64_t* h1) {
  *h0 = H * t / nt;
  *h1 = H * (t + 1) / nt;
}
// Forward over all chunks of heads [h0, h1), chunk-major: chunk c of every head of the group
// before chunk c + 1 (the heads of a token share its memory pages and cache lines, so the
// strided per-head rows are fetched once per group, not once per head). o may be null (state
// pass only); state_in (initial, null = zero) and state_out (final, may be null) are
// [H, Dk, Dv] and may alias; save: store the per-chunk quantities into ws.
void forward_heads(const Geom& gm, Scratch& s, KDAWorkspace::Impl& ws, float* o, const float* state_in,
                   float* state_out, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int64_t h0, int64_t h1, bool save);
// A sub-operand starting at row i0 of A (non-transposed).
inline AOp a_rows(const AOp& a, int64_t i0) {
  AOp r = a;
  if (a.f) r.f = a.f + i0 * a.lda;
  if (a.h) r.h = a.h + i0 * a.ldh;
  return r;
}

}  // namespace k3::kda_fast
