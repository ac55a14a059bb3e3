// yt = W xt for few columns (see small_matmul.h).
#include "kernels/small_matmul.h"

#include <algorithm>

#include "core/error.h"

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

// Rows [r0, r0 + R) x columns [c0, c0 + 16 NV) (the last vector masked by `last`).
template <int R, int NV>
void tile(float* yt, const float* xt, const float* W, int64_t r0, int64_t c0, int64_t in, int64_t ldx, int64_t ldy,
          __mmask16 last) {
  __m512 acc[R][NV];
  #pragma GCC unroll 32
  for (auto& a : acc)
    #pragma GCC unroll 32
    for (auto& v : a) v = _mm512_setzero_ps();
  const float* w = W + r0 * in;
  const float* x = xt + c0;
  for (int64_t k = 0; k < in; ++k, x += ldx) {
    __m512 xv[NV];
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v)
      xv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, x + 16 * v) : _mm512_loadu_ps(x + 16 * v);
    #pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(w[r * in + k]);
      #pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(b, xv[v], acc[r][v]);
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      float* dst = yt + (r0 + r) * ldy + c0 + 16 * v;
      if (v == NV - 1) _mm512_mask_storeu_ps(dst, last, acc[r][v]);
      else _mm512_storeu_ps(dst, acc[r][v]);
    }
}

// All rows for one block of columns; R chosen so that R x NV accumulators stay in registers.
template <int NV>
void column_block(float* yt, const float* xt, const float* W, int64_t c0, int64_t in, int64_t out, int64_t ldx,
                  int64_t ldy, __mmask16 last) {
  constexpr int R = NV == 4 ? 6 : 8;
  int64_t r = 0;
  for (; r + R <= out; r += R) tile<R, NV>(yt, xt, W, r, c0, in, ldx, ldy, last);
  for (; r < out; ++r) tile<1, NV>(yt, xt, W, r, c0, in, ldx, ldy, last);
}

#endif  // __AVX512F__

}  // namespace

void linear_cols(float* yt, const float* xt, const float* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                 int64_t ldy) {
  K3_ASSERT(n >= 0 && in > 0 && out >= 0 && ldx >= n && ldy >= n, "linear_cols: bad dimensions");
#if defined(__AVX512F__)
  for (int64_t c0 = 0; c0 < n; c0 += 64) {
    const int64_t w = std::min<int64_t>(64, n - c0);
    const int nv = int((w + 15) / 16);
    const __mmask16 last = __mmask16(w % 16 == 0 ? 0xffffu : (1u << (w % 16)) - 1);
    switch (nv) {
      case 1: column_block<1>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
      case 2: column_block<2>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
      case 3: column_block<3>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
      default: column_block<4>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
    }
  }
#else
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < n; ++c) yt[r * ldy + c] = 0.f;
    for (int64_t k = 0; k < in; ++k) {
      const float w = W[r * in + k];
      for (int64_t c = 0; c < n; ++c) yt[r * ldy + c] += w * xt[k * ldx + c];
    }
  }
#endif
}

template <typename T>
void linear_cols_reference(T* yt, const T* xt, const T* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                           int64_t ldy) {
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += double(W[r * in + k]) * double(xt[k * ldx + c]);
      yt[r * ldy + c] = T(acc);
    }
}

template void linear_cols_reference<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                           int64_t);
template void linear_cols_reference<double>(double*, const double*, const double*, int64_t, int64_t, int64_t, int64_t,
                                            int64_t);

}  // namespace k3
