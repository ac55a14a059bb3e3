// The vector pieces of the fast chunked KDA kernel (kda_fast_impl.h), compiled once per SIMD
// target (Highway): exp, the per-row decay factors of the chunk preparation, the UT transform's
// forward substitution, the scaled (optionally streaming) row store, and the decode step's
// per-head update. The rest of the kernel is scalar bookkeeping and tile products
// (kernels/matmul_bf16.h, also per target).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/kda_fast_impl.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/kda_fast_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {
namespace {

// e^x below -88 is flushed to 0 (the state never needs subnormal decays; FlushDenormals).
HWY_INLINE VF ExpFlush(DF d, VF x) {
  const VF e = Exp(d, x);
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -88.f)), e);
}

// Forward substitution with row i of Linv held in NV registers (C = L NV columns).
template <int NV>
void ut_rows(float* Linv, const float* Akk, const float* beta, int64_t C) {
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d));
  for (int64_t i = 0; i < C; ++i) {
    VF row[NV];
    for (int w = 0; w < NV; ++w) row[w] = hn::Zero(d);
    const float bi = -beta[i];
    // row_i = e_i - beta_i sum_{j<i} Akk[i,j] row_j; row_j is zero beyond column j, so only
    // its first j/L + 1 vectors are read.
    for (int64_t j = 0; j < i; ++j) {
      const VF c = hn::Set(d, bi * Akk[i * C + j]);
      const float* rj = Linv + j * C;
      const int wmax = int(j / L);
      for (int w = 0; w < NV; ++w)
        if (w <= wmax) row[w] = hn::MulAdd(c, hn::LoadU(d, rj + L * w), row[w]);
    }
    for (int w = 0; w < NV; ++w) hn::StoreU(row[w], d, Linv + i * C + L * w);
    Linv[i * C + i] = 1.f;
  }
}

// Plain rows for widths that do not fit the register budget (C / L > 8 on narrow targets).
void ut_rows_plain(float* Linv, const float* Akk, const float* beta, int64_t C) {
  std::memset(Linv, 0, size_t(C * C) * 4);
  for (int64_t i = 0; i < C; ++i) {
    float* row = Linv + i * C;
    row[i] = 1.f;
    for (int64_t j = 0; j < i; ++j) {
      const float c = -beta[i] * Akk[i * C + j];
      const float* rj = Linv + j * C;
      for (int64_t m = 0; m <= j; ++m) row[m] += c * rj[m];
    }
  }
}

// One head of the decode step, columns [j0, j0 + L NV) (the last vector `last` wide). Pass 1
// reads each row of S once for u and p; pass 2 rewrites it.
template <int NV>
void decode_cols(float* o, float* S, const float* q, const float* k, const float* v, const float* a, float b, float qk,
                 float sc, int64_t Dk, int64_t Dv, int64_t j0, size_t last) {
  const DF d;
  const size_t L = hn::Lanes(d);
  auto load = [&](const float* p, int w) { return (w == NV - 1 && last < L) ? LoadTail(d, p, last) : hn::LoadU(d, p); };
  auto store = [&](VF x, float* p, int w) {
    if (w == NV - 1 && last < L)
      StoreTail(d, x, p, last);
    else
      hn::StoreU(x, d, p);
  };
  VF u[NV], p[NV];
  for (int w = 0; w < NV; ++w) u[w] = p[w] = hn::Zero(d);
  for (int64_t dd = 0; dd < Dk; ++dd) {
    const float* row = S + dd * Dv + j0;
    const VF ak = hn::Set(d, a[dd] * k[dd]), aq = hn::Set(d, a[dd] * q[dd]);
    for (int w = 0; w < NV; ++w) {
      const VF x = load(row + L * w, w);
      u[w] = hn::MulAdd(ak, x, u[w]);
      p[w] = hn::MulAdd(aq, x, p[w]);
    }
  }
  // d = beta (v - u);  o = scale (p + (q.k) d)
  VF dl[NV];
  for (int w = 0; w < NV; ++w) {
    dl[w] = hn::Mul(hn::Set(d, b), hn::Sub(load(v + j0 + L * w, w), u[w]));
    store(hn::Mul(hn::Set(d, sc), hn::MulAdd(hn::Set(d, qk), dl[w], p[w])), o + j0 + L * w, w);
  }
  // S = diag(a) S + k d^T
  for (int64_t dd = 0; dd < Dk; ++dd) {
    float* row = S + dd * Dv + j0;
    const VF ad = hn::Set(d, a[dd]), kd = hn::Set(d, k[dd]);
    for (int w = 0; w < NV; ++w) store(hn::MulAdd(kd, dl[w], hn::Mul(ad, load(row + L * w, w))), row + L * w, w);
  }
}

}  // namespace

void Vexp(float* dst, const float* src, int64_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= size_t(n); i += L) hn::StoreU(ExpFlush(d, hn::LoadU(d, src + i)), d, dst + i);
  if (i < size_t(n)) StoreTail(d, ExpFlush(d, LoadTail(d, src + i, size_t(n) - i)), dst + i, size_t(n) - i);
}

void StoreRow(float* HWY_RESTRICT dst, const float* HWY_RESTRICT src, int64_t n, float alpha, bool stream) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const VF a = hn::Set(d, alpha);
  size_t i = 0;
  if (stream && (reinterpret_cast<uintptr_t>(dst) % (L * sizeof(float))) == 0) {
    for (; i + L <= size_t(n); i += L) hn::Stream(hn::Mul(a, hn::LoadU(d, src + i)), d, dst + i);
  } else {
    for (; i + L <= size_t(n); i += L) hn::StoreU(hn::Mul(a, hn::LoadU(d, src + i)), d, dst + i);
  }
  for (; i < size_t(n); ++i) dst[i] = alpha * src[i];
}

// One row of the chunk preparation's second pass (kda_fast_common.cpp prep_chunk): from the
// cumulative decay G_i and the anchors, K E, Q E, K e^(G_last - G) and the anchored X, Qx, Y;
// the factors themselves only when kept (E non-null). Kp is a multiple of 16.
void PrepRow(const float* Gi, const float* Ki, const float* Qi, const float* Gl, const float* Gr, const float* Gc,
             float* Ke, float* Qe, float* Kd, float* X, float* Qx, float* Y, float* E, float* Edl, float* Ex,
             float* Ey, int64_t Kp) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const bool same_anchor = Gr != nullptr && Gr == Gc;
  for (size_t c = 0; c < size_t(Kp); c += L) {
    const VF g = hn::LoadU(d, Gi + c), kk = hn::LoadU(d, Ki + c), qq = hn::LoadU(d, Qi + c);
    const VF e = ExpFlush(d, g), edl = ExpFlush(d, hn::Sub(hn::LoadU(d, Gl + c), g));
    const VF ex = Gr ? ExpFlush(d, hn::Sub(g, hn::LoadU(d, Gr + c))) : e;
    // Dense path (one anchor per tile, Gr == Gc): e^(Gc - G) = 1 / e^(G - Gr), and both lie
    // in [e^-40, e^40] (kda_fast.h), so a division replaces the fourth exp (1.07x forward).
    const VF ey = same_anchor ? hn::Div(hn::Set(d, 1.f), ex) : ExpFlush(d, hn::Sub(hn::LoadU(d, Gc + c), g));
    hn::StoreU(hn::Mul(kk, e), d, Ke + c);
    hn::StoreU(hn::Mul(qq, e), d, Qe + c);
    hn::StoreU(hn::Mul(kk, edl), d, Kd + c);
    hn::StoreU(hn::Mul(kk, ex), d, X + c);
    hn::StoreU(hn::Mul(qq, ex), d, Qx + c);
    hn::StoreU(hn::Mul(kk, ey), d, Y + c);
    if (E) {
      hn::StoreU(e, d, E + c);
      hn::StoreU(edl, d, Edl + c);
      hn::StoreU(ex, d, Ex + c);
      hn::StoreU(ey, d, Ey + c);
    }
  }
}

void UtRows(float* Linv, const float* Akk, const float* beta, int64_t C) {
  const int64_t L = int64_t(hn::Lanes(DF()));
  switch (C / L) {
    case 1: ut_rows<1>(Linv, Akk, beta, C); break;
    case 2: ut_rows<2>(Linv, Akk, beta, C); break;
    case 3: ut_rows<3>(Linv, Akk, beta, C); break;
    case 4: ut_rows<4>(Linv, Akk, beta, C); break;
    case 5: ut_rows<5>(Linv, Akk, beta, C); break;
    case 6: ut_rows<6>(Linv, Akk, beta, C); break;
    case 7: ut_rows<7>(Linv, Akk, beta, C); break;
    case 8: ut_rows<8>(Linv, Akk, beta, C); break;
    default: ut_rows_plain(Linv, Akk, beta, C); break;
  }
}

void DecodeHead(float* o, float* S, const float* q, const float* k, const float* v, const float* a, float b, float qk,
                float sc, int64_t Dk, int64_t Dv) {
  const int64_t L = int64_t(hn::Lanes(DF()));
  // Column blocks of up to 8 vectors keep u, p (and then d) in half the registers.
  constexpr int64_t kMaxNv = kVecRegs == 32 ? 8 : 4;
  for (int64_t j0 = 0; j0 < Dv; j0 += L * kMaxNv) {
    const int64_t nv = std::min<int64_t>(kMaxNv, (Dv - j0 + L - 1) / L);
    const size_t last = size_t(std::min<int64_t>(L, Dv - j0 - (nv - 1) * L));
    switch (nv) {
      case 1: decode_cols<1>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
      case 2: decode_cols<2>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
      case 3: decode_cols<3>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
      case 4: decode_cols<4>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
      case 5: decode_cols<5>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
      case 6: decode_cols<6>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
      case 7: decode_cols<7>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
      default: decode_cols<8>(o, S, q, k, v, a, b, qk, sc, Dk, Dv, j0, last); break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3::kda_fast {

HWY_EXPORT(Vexp);
HWY_EXPORT(StoreRow);
HWY_EXPORT(PrepRow);
HWY_EXPORT(UtRows);
HWY_EXPORT(DecodeHead);

void vexp(float* dst, const float* src, int64_t n) { HWY_DYNAMIC_DISPATCH(Vexp)(dst, src, n); }

void store_row(float* __restrict dst, const float* __restrict src, int64_t n, float alpha, bool stream) {
  HWY_DYNAMIC_DISPATCH(StoreRow)(dst, src, n, alpha, stream);
}

void store_fence() { hwy::FlushStream(); }

void prep_row(const float* Gi, const float* Ki, const float* Qi, const float* Gl, const float* Gr, const float* Gc,
              float* Ke, float* Qe, float* Kd, float* X, float* Qx, float* Y, float* E, float* Edl, float* Ex,
              float* Ey, int64_t Kp) {
  HWY_DYNAMIC_DISPATCH(PrepRow)(Gi, Ki, Qi, Gl, Gr, Gc, Ke, Qe, Kd, X, Qx, Y, E, Edl, Ex, Ey, Kp);
}

void ut_rows(float* Linv, const float* Akk, const float* beta, int64_t C) {
  HWY_DYNAMIC_DISPATCH(UtRows)(Linv, Akk, beta, C);
}

void decode_head_update(float* o, float* S, const float* q, const float* k, const float* v, const float* a, float b,
                        float qk, float sc, int64_t Dk, int64_t Dv) {
  HWY_DYNAMIC_DISPATCH(DecodeHead)(o, S, q, k, v, a, b, qk, sc, Dk, Dv);
}

}  // namespace k3::kda_fast
#endif  // HWY_ONCE
