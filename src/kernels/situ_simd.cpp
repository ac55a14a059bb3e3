// Vectorised SiTU (see situ_simd.h).
#include "kernels/situ_simd.h"

#include "kernels/activations.h"

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise an "undefined" operand (GCC PR 105593, fixed
// in 12.3), which -Wuninitialized reports wherever they are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace k3 {

namespace {

#if defined(__AVX512F__)

// Cephes expf. The clamps keep the reduction exact (fx * C1 has few bits) while still
// reaching the overflow (> 88.72) and underflow (< -103.3) ends, where vscalefps returns inf
// and 0. min/max take x as the second operand so that a NaN x passes through.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(100.f), x);
  x = _mm512_max_ps(_mm512_set1_ps(-110.f), x);
  const __m512 fx =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, z, _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, fx);
}

// Cephes tanhf's small branch, x + x^3 P(x^2), accurate for |x| < 0.625.
inline __m512 tanh_small_ps(__m512 x) {
  const __m512 s = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(-3.33332819422e-1f));
  return _mm512_fmadd_ps(_mm512_mul_ps(p, s), x, x);
}

// Cephes tanhf: x + x^3 P(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (exp(2|x|) + 1)).
inline __m512 tanh_ps(__m512 x) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(int(0x80000000u)));
  const __m512 ax = _mm512_andnot_ps(sign, x);
  const __m512 small = tanh_small_ps(x);
  const __m512 e = exp_ps(_mm512_add_ps(ax, ax));
  const __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.f),
                                   _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, _mm512_set1_ps(1.f))));
  const __m512 big_signed = _mm512_or_ps(big, _mm512_and_ps(sign, x));
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, big_signed, small);
}

inline __m512 situ_ps(__m512 g, __m512 u, __m512 b1, __m512 b2, __m512 inv_b1, __m512 inv_b2) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g))));
  // Same association as the scalar situ: ((b1 tanh(g/b1)) sig) b2) tanh(u/b2).
  const __m512 cap_g = _mm512_mul_ps(_mm512_mul_ps(b1, tanh_ps(_mm512_mul_ps(g, inv_b1))), sig);
  return _mm512_mul_ps(_mm512_mul_ps(cap_g, b2), tanh_ps(_mm512_mul_ps(u, inv_b2)));
}

// tanh(x) and its derivative 1 - tanh(x)^2, both from one exp for |x| >= 0.625:
// with e = exp(-2|x|), tanh = sign(x) (1 - e) / (1 + e) and 1 - tanh^2 = 4 e / (1 + e)^2, so
// the derivative keeps its relative precision where tanh^2 is close to 1 (1 - th*th would
// cancel); below 0.625 Cephes' polynomial and 1 - th^2 (th^2 < 0.4: no cancellation).
inline void tanh_dtanh_ps(__m512 x, __m512* th, __m512* dth) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(int(0x80000000u)));
  const __m512 ax = _mm512_andnot_ps(sign, x);
  const __m512 small = tanh_small_ps(x);  // one exp per call: the big branch's, below
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_add_ps(ax, ax)));
  const __m512 r = _mm512_div_ps(one, _mm512_add_ps(one, e));
  const __m512 big = _mm512_or_ps(_mm512_mul_ps(_mm512_sub_ps(one, e), r), _mm512_and_ps(sign, x));
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  *th = _mm512_mask_blend_ps(is_small, big, small);
  const __m512 d_big = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(4.f), e), _mm512_mul_ps(r, r));
  *dth = _mm512_mask_blend_ps(is_small, d_big, _mm512_fnmadd_ps(small, small, one));
}

// The scalar situ_grad's formulas (activations.h), times dout:
//   dg = ((1 - th^2) sg + b1 th sg (1 - sg)) b2 tu,  du = b1 th sg b2 (1 - tu^2),
// with 1 - sg = exp(-g) sg and 1 - th^2 from tanh_dtanh_ps (both without cancellation).
inline void situ_grad_ps(__m512 g, __m512 u, __m512 dout, __m512 b1, __m512 b2, __m512 inv_b1, __m512 inv_b2,
                         __m512* dg, __m512* du) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 en = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, en));
  // 1 - sg: exp(-g) sg, but for g < -88 exp(-g) is inf and sg 0, whose product is NaN where
  // 1 - sg is 1: min returns its second operand when the first is NaN. (A NaN g stays NaN in
  // sg, so in dg.)
  const __m512 one_m_sg = _mm512_min_ps(_mm512_mul_ps(en, sg), one);
  __m512 th, dth, tu, dtu;
  tanh_dtanh_ps(_mm512_mul_ps(g, inv_b1), &th, &dth);
  tanh_dtanh_ps(_mm512_mul_ps(u, inv_b2), &tu, &dtu);
  const __m512 cap_g = _mm512_mul_ps(_mm512_mul_ps(b1, th), sg);
  const __m512 cap_u = _mm512_mul_ps(b2, tu);
  const __m512 d_th = _mm512_mul_ps(dth, sg);          // (1 - th^2) sg
  const __m512 d_sg = _mm512_mul_ps(cap_g, one_m_sg);  // b1 th sg (1 - sg)
  *dg = _mm512_mul_ps(dout, _mm512_mul_ps(_mm512_add_ps(d_th, d_sg), cap_u));
  *du = _mm512_mul_ps(dout, _mm512_mul_ps(cap_g, dtu));
}

#endif  // __AVX512F__

}  // namespace

void situ_backward_fast(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                        double b1, double b2) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vb1 = _mm512_set1_ps(float(b1)), vb2 = _mm512_set1_ps(float(b2));
  const __m512 ib1 = _mm512_set1_ps(float(1.0 / b1)), ib2 = _mm512_set1_ps(float(1.0 / b2));
  __m512 dg, du;
  for (; i + 16 <= n; i += 16) {
    situ_grad_ps(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i), _mm512_loadu_ps(dout + i), vb1, vb2, ib1, ib2,
                 &dg, &du);
    _mm512_storeu_ps(dgate + i, dg);
    _mm512_storeu_ps(dup + i, du);
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    situ_grad_ps(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i),
                 _mm512_maskz_loadu_ps(m, dout + i), vb1, vb2, ib1, ib2, &dg, &du);
    _mm512_mask_storeu_ps(dgate + i, m, dg);
    _mm512_mask_storeu_ps(dup + i, m, du);
    i = n;
  }
#endif
  for (; i < n; ++i) {
    float dg, du;
    situ_grad(gate[i], up[i], float(b1), float(b2), &dg, &du);
    dgate[i] = dout[i] * dg, dup[i] = dout[i] * du;
  }
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

void situ_forward_fast(float* out, const float* gate, const float* up, int64_t n, double b1, double b2) {
  int64_t i = 0;
#if defined(__AVX512F__)
  // g / b1 as g * (1 / b1): exact for the power-of-two betas K3 uses (4), within an ulp else.
  const __m512 vb1 = _mm512_set1_ps(float(b1)), vb2 = _mm512_set1_ps(float(b2));
  const __m512 ib1 = _mm512_set1_ps(float(1.0 / b1)), ib2 = _mm512_set1_ps(float(1.0 / b2));
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, situ_ps(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i), vb1, vb2, ib1, ib2));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m,
                          situ_ps(_mm512_maskz_loadu_ps(m, gate + i), _mm512_maskz_loadu_ps(m, up + i), vb1, vb2,
                                  ib1, ib2));
    i = n;
  }
#endif
  for (; i < n; ++i) out[i] = situ(gate[i], up[i], float(b1), float(b2));
}

template <typename T>
void situ_forward_reference(T* out, const T* gate, const T* up, int64_t n, double b1, double b2) {
  for (int64_t i = 0; i < n; ++i) out[i] = situ(gate[i], up[i], T(b1), T(b2));
}

template void situ_forward_reference<float>(float*, const float*, const float*, int64_t, double, double);
template void situ_forward_reference<double>(double*, const double*, const double*, int64_t, double, double);

}  // namespace k3
