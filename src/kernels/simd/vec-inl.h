// Per-target SIMD helpers shared by the kernels (Highway, compiled once per target through
// hwy/foreach_target.h by each kernel file that includes this): register budget, tails
// through a stack buffer, a fixed-order horizontal sum, and exp / tanh with the special
// values of libm (inf above the overflow point, 0 below underflow, NaN propagated).
// Re-included once per target: the guard toggles with HWY_TARGET_TOGGLE (Highway's idiom).
#if defined(K3_KERNELS_SIMD_VEC_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef K3_KERNELS_SIMD_VEC_INL_H_
#undef K3_KERNELS_SIMD_VEC_INL_H_
#else
#define K3_KERNELS_SIMD_VEC_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;

// Vector registers the tiles may plan for: AVX-512 has 32, AVX2 / SSE4 16 (the scalar baseline
// has one lane per "vector"; 16 keeps its tiles the SSE4 ones).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
constexpr int kVecRegs = 32;
#else
constexpr int kVecRegs = 16;
#endif

// n < Lanes(d) floats from p, zeros beyond, never touching memory past p + n (no fault at a
// page end): masked loads and stores on AVX2 / AVX-512; on SSE4 and the baseline Highway's masked
// forms touch the whole vector, so those go through a stack buffer.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
HWY_INLINE VF LoadTail(DF d, const float* HWY_RESTRICT p, size_t n) { return hn::MaskedLoad(hn::FirstN(d, n), d, p); }
HWY_INLINE void StoreTail(DF d, VF v, float* HWY_RESTRICT p, size_t n) { hn::BlendedStore(v, hn::FirstN(d, n), d, p); }
#else
HWY_INLINE VF LoadTail(DF d, const float* HWY_RESTRICT p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())] = {};
  std::memcpy(buf, p, n * sizeof(float));
  return hn::Load(d, buf);
}
HWY_INLINE void StoreTail(DF d, VF v, float* HWY_RESTRICT p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, n * sizeof(float));
}
#endif

// Sum of the lanes in one fixed order per target (batch invariance needs only that the
// order never depends on the data or on the call).
HWY_INLINE float HSum(DF d, VF v) { return hn::GetLane(hn::SumOfLanes(d, v)); }

// 2^n for integral-valued float n in [-160, 160]: two exact powers of two (each in the normal
// range), so the product overflows to inf and underflows gradually to 0 like vscalefps.
HWY_INLINE VF Pow2Mul(DF d, VF y, VF n) {
  const DI di;
  const auto ni = hn::ConvertTo(di, n);
  const auto n1 = hn::ShiftRight<1>(ni);  // floor(n / 2)
  const auto n2 = hn::Sub(ni, n1);
  const auto bias = hn::Set(di, 127);
  const VF p1 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n1, bias)));
  const VF p2 = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n2, bias)));
  return hn::Mul(hn::Mul(y, p1), p2);
}

// e^x: n = round(x log2 e), r = x - n ln2 (two-part ln 2), degree-7 Taylor polynomial for e^r
// (|r| <= ln2/2, error below 1 ulp), times 2^n. x > 88.73 gives inf, x < -103.98 gives 0,
// NaN stays NaN.
HWY_INLINE VF Exp(DF d, VF x) {
  const VF xc = hn::Min(hn::Max(x, hn::Set(d, -110.f)), hn::Set(d, 100.f));
  const VF n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  VF r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, 1.428606765330187045e-06f), r);
  VF p = hn::Set(d, 1.f / 5040);
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 720));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 120));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 24));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 6));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f));
  const VF e = Pow2Mul(d, p, n);
  return hn::IfThenElse(hn::IsNaN(x), x, e);  // min/max NaN semantics differ per target
}

// Cephes tanhf's small branch, x + x^3 P(x^2), accurate for |x| < 0.625.
HWY_INLINE VF TanhSmall(DF d, VF x) {
  const VF s = hn::Mul(x, x);
  VF p = hn::Set(d, -5.70498872745e-3f);
  p = hn::MulAdd(p, s, hn::Set(d, 2.06390887954e-2f));
  p = hn::MulAdd(p, s, hn::Set(d, -5.37397155531e-2f));
  p = hn::MulAdd(p, s, hn::Set(d, 1.33314422036e-1f));
  p = hn::MulAdd(p, s, hn::Set(d, -3.33332819422e-1f));
  return hn::MulAdd(hn::Mul(p, s), x, x);
}

// tanh(x) and 1 - tanh(x)^2 from one exp: with e = exp(-2|x|) (|x| >= 0.625),
// tanh = sign(x) (1 - e) / (1 + e) and 1 - tanh^2 = 4 e / (1 + e)^2, which keeps its relative
// precision where tanh^2 is close to 1 (1 - th*th would cancel to 0 or worse); below 0.625
// Cephes' polynomial and 1 - th^2 (th^2 < 0.31: no cancellation). NaN in, NaN out.
HWY_INLINE void TanhDtanh(DF d, VF x, VF* th, VF* dth) {
  const VF one = hn::Set(d, 1.f);
  const VF ax = hn::Abs(x);
  const VF small = TanhSmall(d, x);
  const VF e = Exp(d, hn::Neg(hn::Add(ax, ax)));
  const VF r = hn::Div(one, hn::Add(one, e));
  const VF big = hn::CopySign(hn::Mul(hn::Sub(one, e), r), x);
  const auto is_small = hn::Lt(ax, hn::Set(d, 0.625f));
  *th = hn::IfThenElse(is_small, small, big);
  const VF d_big = hn::Mul(hn::Mul(hn::Set(d, 4.f), e), hn::Mul(r, r));
  *dth = hn::IfThenElse(is_small, hn::NegMulAdd(small, small, one), d_big);
}

HWY_INLINE VF Tanh(DF d, VF x) {
  VF th, dth;
  TanhDtanh(d, x, &th, &dth);
  return th;
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#endif  // K3_KERNELS_SIMD_VEC_INL_H_
