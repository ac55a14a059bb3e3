// Products with MXFP4 weight matrices: fused-decode linear and dequantisation, AVX-512 paths
// and plain references (see mxfp4_linear.h).
#include "kernels/mxfp4_linear.h"

#include <algorithm>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics self-initialise an "undefined" operand (GCC PR 105593, fixed
// in 12.3), which -Wuninitialized reports wherever they are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "core/dtype.h"
#include "core/error.h"

namespace k3 {

namespace {

void check_shape(int64_t in) { K3_ASSERT(in > 0 && in % 32 == 0, "mxfp4: the input width must be a multiple of 32"); }

#if defined(__AVX512F__)

// The E8M0 scales of one row as floats, 16 at a time: 2^(s-127), s = 0 the subnormal 2^-127,
// s = 255 NaN (e8m0_to_f32, core/dtype.h).
void decode_scales(float* dst, const uint8_t* s, int64_t n) {
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  int64_t g = 0;
  for (; g + 16 <= n; g += 16) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + g)));
    const __mmask16 edge = _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512()) |
                           _mm512_cmpeq_epi32_mask(v, _mm512_set1_epi32(255));
    const __m512i bits = _mm512_mask_or_epi32(_mm512_slli_epi32(v, 23), edge, _mm512_slli_epi32(v, 23), quiet);
    _mm512_storeu_ps(dst + g, _mm512_castsi512_ps(bits));
  }
  for (; g < n; ++g) dst[g] = e8m0_to_f32(s[g]);
}

float hsum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// One 32-group of a row: the 16 even (low nibble) and 16 odd (high nibble) weights.
inline void decode_group(__m512& even, __m512& odd, const uint8_t* p, __m512 lut_scaled) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  even = _mm512_permutexvar_ps(b, lut_scaled);  // vpermps reads the index's low 4 bits
  odd = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut_scaled);
}

// x rows [nt, in] -> xs [nt, in/32, 2, 16]: per 32-group the even then the odd elements.
void split_even_odd(float* xs, const float* x, int64_t nt, int64_t in) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t i = 0; i < nt * in; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(xs + i, _mm512_permutex2var_ps(a, ev, b));
    _mm512_storeu_ps(xs + i + 16, _mm512_permutex2var_ps(a, od, b));
  }
}

constexpr int64_t kPrefetchRows = 16;

// RB weight rows [r0, r0 + RB) against NT split rows of x; NA accumulators per (row, x row)
// (two where few chains would otherwise wait on the FMA latency).
template <int RB, int NT>
void rows_block(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales, int64_t r0,
                int64_t in, bool accumulate, float* sc) {
  constexpr int NA = NT <= 2 ? 2 : 1;
  const int64_t G = in / 32;
  const __m512 lut = _mm512_loadu_ps(kE2M1);
  #pragma GCC unroll 32
  for (int r = 0; r < RB; ++r) decode_scales(sc + r * G, scales + (r0 + r) * G, G);
  __m512 acc[RB][NT][NA];
  #pragma GCC unroll 32
  for (auto& a : acc)
    #pragma GCC unroll 32
    for (auto& b : a)
      #pragma GCC unroll 32
      for (auto& c : b) c = _mm512_setzero_ps();
  // Rows kPrefetchRows ahead are requested while these are decoded: one expert matrix is too
  // short for the hardware prefetcher to ramp up on its own (16 bytes per row and group).
  const uint8_t* ahead = packed + (r0 + kPrefetchRows) * (in / 2);
  for (int64_t g = 0; g < G; ++g) {
    if (g % 4 == 0)  // one 64-byte line per row every 4 groups
#pragma GCC unroll 32
      for (int r = 0; r < RB; ++r) _mm_prefetch(reinterpret_cast<const char*>(ahead + r * (in / 2) + g * 16), _MM_HINT_T0);
    __m512 xe[NT], xo[NT];
    #pragma GCC unroll 32
    for (int t = 0; t < NT; ++t) {
      xe[t] = _mm512_loadu_ps(xs + t * in + g * 32);
      xo[t] = _mm512_loadu_ps(xs + t * in + g * 32 + 16);
    }
    #pragma GCC unroll 32
    for (int r = 0; r < RB; ++r) {
      __m512 we, wo;
      decode_group(we, wo, packed + (r0 + r) * (in / 2) + g * 16, _mm512_mul_ps(lut, _mm512_set1_ps(sc[r * G + g])));
      #pragma GCC unroll 32
      for (int t = 0; t < NT; ++t) {
        acc[r][t][0] = _mm512_fmadd_ps(we, xe[t], acc[r][t][0]);
        acc[r][t][NA - 1] = _mm512_fmadd_ps(wo, xo[t], acc[r][t][NA - 1]);
      }
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < RB; ++r)
    #pragma GCC unroll 32
    for (int t = 0; t < NT; ++t) {
      const float v = hsum(NA == 2 ? _mm512_add_ps(acc[r][t][0], acc[r][t][NA - 1]) : acc[r][t][0]);
      float& dst = y[t * ldy + r0 + r];
      dst = accumulate ? dst + v : v;
    }
}

template <int NT>
void all_rows(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales, int64_t in,
              int64_t out, bool accumulate, float* sc) {
  int64_t r = 0;
  for (; r + 4 <= out; r += 4) rows_block<4, NT>(y, ldy, xs, packed, scales, r, in, accumulate, sc);
  for (; r < out; ++r) rows_block<1, NT>(y, ldy, xs, packed, scales, r, in, accumulate, sc);
}

#endif  // __AVX512F__

}  // namespace

void mxfp4_linear(float* y, const float* x, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t in,
                  int64_t out, int64_t ldy, bool accumulate) {
  check_shape(in);
  K3_ASSERT(ldy >= out, "mxfp4_linear: ldy < out");
#if defined(__AVX512F__)
  // Per-thread work area (grows once): up to 4 split rows of x and 4 rows of scales.
  thread_local std::vector<float> work;
  if (work.size() < size_t(4 * in + 4 * (in / 32))) work.resize(size_t(4 * in + 4 * (in / 32)));
  float* xs = work.data();
  float* sc = xs + 4 * in;
  for (int64_t t0 = 0; t0 < rows; t0 += 4) {
    const int64_t nt = std::min<int64_t>(4, rows - t0);
    split_even_odd(xs, x + t0 * in, nt, in);
    float* yt = y + t0 * ldy;
    switch (nt) {
      case 1: all_rows<1>(yt, ldy, xs, packed, scales, in, out, accumulate, sc); break;
      case 2: all_rows<2>(yt, ldy, xs, packed, scales, in, out, accumulate, sc); break;
      case 3: all_rows<3>(yt, ldy, xs, packed, scales, in, out, accumulate, sc); break;
      default: all_rows<4>(yt, ldy, xs, packed, scales, in, out, accumulate, sc); break;
    }
  }
#else
  // Portable path: one decoded row at a time, float dot products.
  thread_local std::vector<float> row;
  if (row.size() < size_t(in)) row.resize(size_t(in));
  for (int64_t r = 0; r < out; ++r) {
    mxfp4_decode_row(packed + r * (in / 2), scales + r * (in / 32), row.data(), size_t(in));
    for (int64_t t = 0; t < rows; ++t) {
      float acc = 0;
      for (int64_t c = 0; c < in; ++c) acc += row[c] * x[t * in + c];
      y[t * ldy + r] = accumulate ? y[t * ldy + r] + acc : acc;
    }
  }
#endif
}

template <typename T>
void mxfp4_linear_reference(T* y, const T* x, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t in,
                            int64_t out, int64_t ldy, bool accumulate) {
  check_shape(in);
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t r = 0; r < out; ++r) {
    mxfp4_decode_row(packed + r * (in / 2), scales + r * (in / 32), row.data(), size_t(in));
    for (int64_t t = 0; t < rows; ++t) {
      double acc = 0;
      for (int64_t c = 0; c < in; ++c) acc += double(row[c]) * double(x[t * in + c]);
      y[t * ldy + r] = accumulate ? T(double(y[t * ldy + r]) + acc) : T(acc);
    }
  }
}

void mxfp4_dequantize(float* dst, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols) {
  check_shape(cols);
#if defined(__AVX512F__)
  const int64_t G = cols / 32;
  const __m512 lut = _mm512_loadu_ps(kE2M1);
  // Interleave even (a) and odd (b) elements back: lanes 0..15 = a0 b0 a1 b1 ... a7 b7.
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  thread_local std::vector<float> sc;
  if (sc.size() < size_t(G)) sc.resize(size_t(G));
  for (int64_t r = 0; r < rows; ++r) {
    decode_scales(sc.data(), scales + r * G, G);
    for (int64_t g = 0; g < G; ++g) {
      __m512 e, o;
      decode_group(e, o, packed + r * (cols / 2) + g * 16, _mm512_mul_ps(lut, _mm512_set1_ps(sc[g])));
      float* d = dst + r * cols + g * 32;
      _mm512_storeu_ps(d, _mm512_permutex2var_ps(e, lo, o));
      _mm512_storeu_ps(d + 16, _mm512_permutex2var_ps(e, hi, o));
    }
  }
#else
  for (int64_t r = 0; r < rows; ++r)
    mxfp4_decode_row(packed + r * (cols / 2), scales + r * (cols / 32), dst + r * cols, size_t(cols));
#endif
}

template <typename T>
void mxfp4_dequantize_reference(T* dst, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols) {
  check_shape(cols);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    mxfp4_decode_row(packed + r * (cols / 2), scales + r * (cols / 32), row.data(), size_t(cols));
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = T(row[c]);
  }
}

template void mxfp4_linear_reference<float>(float*, const float*, const uint8_t*, const uint8_t*, int64_t, int64_t,
                                            int64_t, int64_t, bool);
template void mxfp4_linear_reference<double>(double*, const double*, const uint8_t*, const uint8_t*, int64_t, int64_t,
                                             int64_t, int64_t, bool);
template void mxfp4_dequantize_reference<float>(float*, const uint8_t*, const uint8_t*, int64_t, int64_t);
template void mxfp4_dequantize_reference<double>(double*, const uint8_t*, const uint8_t*, int64_t, int64_t);

}  // namespace k3
