// Vectorised SiTU (see situ_simd.h), compiled once per SIMD target (Highway dynamic dispatch).
#include "kernels/situ_simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/situ_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd/vec-inl.h"

#include "kernels/activations.h"

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {

HWY_INLINE VF SituV(DF d, VF g, VF u, VF b1, VF b2, VF inv_b1, VF inv_b2) {
  const VF one = hn::Set(d, 1.f);
  const VF sig = hn::Div(one, hn::Add(one, Exp(d, hn::Neg(g))));
  // Same association as the scalar situ: ((b1 tanh(g/b1)) sig) b2) tanh(u/b2).
  const VF cap_g = hn::Mul(hn::Mul(b1, Tanh(d, hn::Mul(g, inv_b1))), sig);
  return hn::Mul(hn::Mul(cap_g, b2), Tanh(d, hn::Mul(u, inv_b2)));
}

// The scalar situ_grad's formulas (activations.h), times dout:
//   dg = ((1 - th^2) sg + b1 th sg (1 - sg)) b2 tu,  du = b1 th sg b2 (1 - tu^2),
// with 1 - sg = exp(-g) sg and 1 - th^2 from TanhDtanh (both without cancellation).
HWY_INLINE void SituGradV(DF d, VF g, VF u, VF dout, VF b1, VF b2, VF inv_b1, VF inv_b2, VF* dg, VF* du) {
  const VF one = hn::Set(d, 1.f);
  const VF en = Exp(d, hn::Neg(g));
  const VF sg = hn::Div(one, hn::Add(one, en));
  // 1 - sg: exp(-g) sg, but for g < -88 exp(-g) is inf and sg 0, whose product is NaN where
  // 1 - sg is 1. (A NaN g stays NaN in sg, so in dg.)
  const VF prod = hn::Mul(en, sg);
  const VF one_m_sg = hn::IfThenElse(hn::IsNaN(prod), hn::IfThenElse(hn::IsNaN(g), g, one), hn::Min(prod, one));
  VF th, dth, tu, dtu;
  TanhDtanh(d, hn::Mul(g, inv_b1), &th, &dth);
  TanhDtanh(d, hn::Mul(u, inv_b2), &tu, &dtu);
  const VF cap_g = hn::Mul(hn::Mul(b1, th), sg);
  const VF cap_u = hn::Mul(b2, tu);
  const VF d_th = hn::Mul(dth, sg);          // (1 - th^2) sg
  const VF d_sg = hn::Mul(cap_g, one_m_sg);  // b1 th sg (1 - sg)
  *dg = hn::Mul(dout, hn::Mul(hn::Add(d_th, d_sg), cap_u));
  *du = hn::Mul(dout, hn::Mul(cap_g, dtu));
}

void SituForward(float* HWY_RESTRICT out, const float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, int64_t n,
                 double b1, double b2) {
  const DF d;
  const size_t N = hn::Lanes(d);
  // g / b1 as g * (1 / b1): exact for the power-of-two betas K3 uses (4), within an ulp else.
  const VF vb1 = hn::Set(d, float(b1)), vb2 = hn::Set(d, float(b2));
  const VF ib1 = hn::Set(d, float(1.0 / b1)), ib2 = hn::Set(d, float(1.0 / b2));
  size_t i = 0;
  for (; i + N <= size_t(n); i += N)
    hn::StoreU(SituV(d, hn::LoadU(d, gate + i), hn::LoadU(d, up + i), vb1, vb2, ib1, ib2), d, out + i);
  if (i < size_t(n)) {
    const size_t r = size_t(n) - i;
    StoreTail(d, SituV(d, LoadTail(d, gate + i, r), LoadTail(d, up + i, r), vb1, vb2, ib1, ib2), out + i, r);
  }
}

void SituBackward(float* HWY_RESTRICT dgate, float* HWY_RESTRICT dup, const float* HWY_RESTRICT dout,
                  const float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, int64_t n, double b1, double b2) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const VF vb1 = hn::Set(d, float(b1)), vb2 = hn::Set(d, float(b2));
  const VF ib1 = hn::Set(d, float(1.0 / b1)), ib2 = hn::Set(d, float(1.0 / b2));
  VF dg, du;
  size_t i = 0;
  for (; i + N <= size_t(n); i += N) {
    SituGradV(d, hn::LoadU(d, gate + i), hn::LoadU(d, up + i), hn::LoadU(d, dout + i), vb1, vb2, ib1, ib2, &dg, &du);
    hn::StoreU(dg, d, dgate + i);
    hn::StoreU(du, d, dup + i);
  }
  if (i < size_t(n)) {
    const size_t r = size_t(n) - i;
    SituGradV(d, LoadTail(d, gate + i, r), LoadTail(d, up + i, r), LoadTail(d, dout + i, r), vb1, vb2, ib1, ib2, &dg,
              &du);
    StoreTail(d, dg, dgate + i, r);
    StoreTail(d, du, dup + i, r);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3 {

HWY_EXPORT(SituForward);
HWY_EXPORT(SituBackward);

void situ_forward_fast(float* out, const float* gate, const float* up, int64_t n, double b1, double b2) {
  HWY_DYNAMIC_DISPATCH(SituForward)(out, gate, up, n, b1, b2);
}

void situ_backward_fast(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                        double b1, double b2) {
  HWY_DYNAMIC_DISPATCH(SituBackward)(dgate, dup, dout, gate, up, n, b1, b2);
}

template <typename T>
void situ_forward_reference(T* out, const T* gate, const T* up, int64_t n, double b1, double b2) {
  for (int64_t i = 0; i < n; ++i) out[i] = situ(gate[i], up[i], T(b1), T(b2));
}

template <typename T>
void situ_backward_reference(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, double b1,
                             double b2) {
  for (int64_t i = 0; i < n; ++i) {
    T dg, du;
    situ_grad(gate[i], up[i], T(b1), T(b2), &dg, &du);
    dgate[i] = dout[i] * dg, dup[i] = dout[i] * du;
  }
}

template void situ_forward_reference<float>(float*, const float*, const float*, int64_t, double, double);
template void situ_forward_reference<double>(double*, const double*, const double*, int64_t, double, double);
template void situ_backward_reference<float>(float*, float*, const float*, const float*, const float*, int64_t, double,
                                             double);
template void situ_backward_reference<double>(double*, double*, const double*, const double*, const double*, int64_t,
                                              double, double);

void situ_glu_forward_fast(float* out, const float* gu, int64_t rows, int64_t F, double b1, double b2) {
#pragma omp parallel for schedule(static) if (rows * F > 65536)
  for (int64_t r = 0; r < rows; ++r) situ_forward_fast(out + r * F, gu + r * 2 * F, gu + r * 2 * F + F, F, b1, b2);
}

void situ_glu_backward_fast(float* dgu, const float* dout, const float* gu, int64_t rows, int64_t F, double b1,
                            double b2) {
#pragma omp parallel for schedule(static) if (rows * F > 65536)
  for (int64_t r = 0; r < rows; ++r)
    situ_backward_fast(dgu + r * 2 * F, dgu + r * 2 * F + F, dout + r * F, gu + r * 2 * F, gu + r * 2 * F + F, F, b1,
                       b2);
}

}  // namespace k3
#endif  // HWY_ONCE
