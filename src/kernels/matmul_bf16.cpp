// Tile products in f32 and bf16 (contract in matmul_bf16.h). The fast paths are register-
// blocked AVX-512 micro-kernels: MR rows x NV*16 columns of C live in zmm registers over the
// whole k loop, A elements (f32) or A pairs (bf16, 4-byte words) are broadcast, B rows (or
// VNNI pair-rows) are loaded as vectors. The column loop is outside the row loop, so a
// K x 16*NV panel of B stays in L1 while the rows stream past it.
#include "kernels/matmul_bf16.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace k3 {

namespace {

// k range [k0, k1) that can hold non-zeros of A for rows [i0, i0 + mr) (see Tri).
inline void tri_range(Tri tri, int64_t i0, int64_t mr, int64_t K, int64_t* k0, int64_t* k1) {
  *k0 = 0;
  *k1 = K;
  if (tri == Tri::Lower) *k1 = std::min(K, i0 + mr);
  if (tri == Tri::Upper) *k0 = std::min(K, i0);
}

}  // namespace

void mm_f32_ref(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb,
                int64_t M, int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  for (int64_t i = 0; i < M; ++i) {
    int64_t k0, k1;
    tri_range(tri, i, 1, K, &k0, &k1);
    for (int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (int64_t k = k0; k < k1; ++k) s += (a_trans ? A[k * lda + i] : A[i * lda + k]) * B[k * ldb + n];
      if (colscale) s *= colscale[n];
      C[i * ldc + n] = accumulate ? C[i * ldc + n] + alpha * s : alpha * s;
    }
  }
}

void mm_bf16_ref(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
                 int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  for (int64_t i = 0; i < M; ++i) {
    int64_t k0, k1;
    tri_range(tri, i, 1, K, &k0, &k1);
    for (int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (int64_t k = k0; k < k1; ++k)
        s += bf16_to_f32(A[i * lda + k]) * bf16_to_f32(Bp[(k / 2) * 2 * ldb + 2 * n + (k & 1)]);
      if (colscale) s *= colscale[n];
      C[i * ldc + n] = accumulate ? C[i * ldc + n] + alpha * s : alpha * s;
    }
  }
}

#if defined(__AVX512F__)

namespace {

inline __m512 epilogue(__m512 acc, float* c, float alpha, bool accumulate, const float* cs) {
  if (cs) acc = _mm512_mul_ps(acc, _mm512_loadu_ps(cs));
  const __m512 va = _mm512_set1_ps(alpha);
  return accumulate ? _mm512_fmadd_ps(acc, va, _mm512_loadu_ps(c)) : _mm512_mul_ps(acc, va);
}

// C[MR, 16*NV] (+)= A[MR, k0:k1] B[k0:k1, 16*NV].
template <int MR, int NV, bool AT>
void ukr_f32(int64_t k0, int64_t k1, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, float alpha, bool accumulate, const float* cs) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = k0; k < k1; ++k) {
    __m512 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(B + k * ldb + 16 * v);
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(AT ? A[k * lda + r] : A[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* c = C + r * ldc + 16 * v;
      _mm512_storeu_ps(c, epilogue(acc[r][v], c, alpha, accumulate, cs ? cs + 16 * v : nullptr));
    }
}

using UkrF32 = void (*)(int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, float, bool,
                        const float*);
constexpr int kMrF32 = 8, kNvF32 = 2;

struct TableF32 {
  UkrF32 f[kMrF32][kNvF32];
};
template <bool AT, int... R>
constexpr TableF32 f32_table(std::integer_sequence<int, R...>) {
  TableF32 t{};
  ((t.f[R][0] = &ukr_f32<R + 1, 1, AT>, t.f[R][1] = &ukr_f32<R + 1, 2, AT>), ...);
  return t;
}
constexpr auto kF32N = f32_table<false>(std::make_integer_sequence<int, kMrF32>{});
constexpr auto kF32T = f32_table<true>(std::make_integer_sequence<int, kMrF32>{});

}  // namespace

void mm_f32(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb, int64_t M,
            int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  K3_ASSERT(N % 16 == 0, "mm_f32: N must be a multiple of 16");
  const auto& tab = a_trans ? kF32T : kF32N;
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kNvF32) {
    const int64_t nv = std::min<int64_t>(kNvF32, (N - n0) / 16);
    const float* cs = colscale ? colscale + n0 : nullptr;
    for (int64_t i0 = 0; i0 < M; i0 += kMrF32) {
      const int64_t mr = std::min<int64_t>(kMrF32, M - i0);
      int64_t k0, k1;
      tri_range(tri, i0, mr, K, &k0, &k1);
      const float* a = a_trans ? A + i0 : A + i0 * lda;
      tab.f[mr - 1][nv - 1](k0, std::max(k0, k1), a, lda, B + n0, ldb, C + i0 * ldc + n0, ldc, alpha, accumulate,
                            cs);
    }
  }
}

#else  // no AVX-512: the plain loops

void mm_f32(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb, int64_t M,
            int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  K3_ASSERT(N % 16 == 0, "mm_f32: N must be a multiple of 16");
  mm_f32_ref(C, ldc, A, lda, a_trans, B, ldb, M, N, K, alpha, accumulate, tri, colscale);
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)

namespace {

// C[MR, 16*NV] (+)= A[MR, 2*kk0 : 2*kk1] B[...]: one vdpbf16ps per (row, column vector, k pair).
template <int MR, int NV>
void ukr_bf16(int64_t kk0, int64_t kk1, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, float* C,
              int64_t ldc, float alpha, bool accumulate, const float* cs) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t kk = kk0; kk < kk1; ++kk) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(Bp + kk * 2 * ldb + 32 * v);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * kk, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* c = C + r * ldc + 16 * v;
      _mm512_storeu_ps(c, epilogue(acc[r][v], c, alpha, accumulate, cs ? cs + 16 * v : nullptr));
    }
}

using UkrBf16 = void (*)(int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, float,
                         bool, const float*);
constexpr int kMrBf = 8, kNvBf = 4;  // MR 8 for up to 2 column vectors, 4 beyond

struct TableBf16 {
  UkrBf16 f[kMrBf][kNvBf];
};
template <int... R>
constexpr TableBf16 bf16_table(std::integer_sequence<int, R...>) {
  TableBf16 t{};
  ((t.f[R][0] = &ukr_bf16<R + 1, 1>, t.f[R][1] = &ukr_bf16<R + 1, 2>,
    t.f[R][2] = R < 4 ? &ukr_bf16<(R < 4 ? R + 1 : 1), 3> : nullptr,
    t.f[R][3] = R < 4 ? &ukr_bf16<(R < 4 ? R + 1 : 1), 4> : nullptr),
   ...);
  return t;
}
constexpr auto kBf = bf16_table(std::make_integer_sequence<int, kMrBf>{});

}  // namespace

bool mm_bf16_native() { return true; }

void mm_bf16(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
             int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  K3_ASSERT(N % 16 == 0 && K % 2 == 0 && lda % 2 == 0, "mm_bf16: N must be a multiple of 16, K and lda even");
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kNvBf) {
    const int64_t nv = std::min<int64_t>(kNvBf, (N - n0) / 16);
    const int64_t mrmax = nv <= 2 ? 8 : 4;  // 16 accumulators either way
    const float* cs = colscale ? colscale + n0 : nullptr;
    for (int64_t i0 = 0; i0 < M; i0 += mrmax) {
      const int64_t mr = std::min<int64_t>(mrmax, M - i0);
      int64_t k0, k1;
      tri_range(tri, i0, mr, K, &k0, &k1);
      const int64_t kk0 = k0 / 2, kk1 = std::max(kk0, (k1 + 1) / 2);
      kBf.f[mr - 1][nv - 1](kk0, kk1, A + i0 * lda, lda, Bp + 2 * n0, ldb, C + i0 * ldc + n0, ldc, alpha, accumulate,
                            cs);
    }
  }
}

void to_bf16(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
             const float* colscale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * lds;
    uint16_t* d = dst + r * ldd;
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = cols - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (cols - c)) - 1);
      __m512 x = _mm512_maskz_loadu_ps(m, s + c);
      if (colscale) x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, colscale + c));
      _mm256_mask_storeu_epi16(d + c, m, (__m256i)_mm512_cvtneps_pbh(x));
    }
  }
}

void pack_vnni(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N) {
  // [lo0..lo15, hi0..hi15] -> [lo0, hi0, lo1, hi1, ...]
  alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kIdx);
  for (int64_t kk = 0; kk < (K + 1) / 2; ++kk) {
    const float* lo = src + 2 * kk * lds;
    const float* hi = 2 * kk + 1 < K ? lo + lds : nullptr;
    uint16_t* d = dst + kk * 2 * ldd;
    for (int64_t n = 0; n < N; n += 16) {
      const __mmask16 m = N - n >= 16 ? __mmask16(0xffff) : __mmask16((1u << (N - n)) - 1);
      const __m512 l = _mm512_maskz_loadu_ps(m, lo + n);
      const __m512 h = hi ? _mm512_maskz_loadu_ps(m, hi + n) : _mm512_setzero_ps();
      const __m512i v = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(h, l));
      _mm512_mask_storeu_epi32(d + 2 * n, m, v);
    }
  }
}

#else  // no AVX512-BF16: the same arithmetic in scalar code

bool mm_bf16_native() { return false; }

void mm_bf16(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
             int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  K3_ASSERT(N % 16 == 0 && K % 2 == 0 && lda % 2 == 0, "mm_bf16: N must be a multiple of 16, K and lda even");
  mm_bf16_ref(C, ldc, A, lda, Bp, ldb, M, N, K, alpha, accumulate, tri, colscale);
}

void to_bf16(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
             const float* colscale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[r * ldd + c] = f32_to_bf16(colscale ? src[r * lds + c] * colscale[c] : src[r * lds + c]);
}

void pack_vnni(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N) {
  for (int64_t kk = 0; kk < (K + 1) / 2; ++kk)
    for (int64_t n = 0; n < N; ++n) {
      dst[kk * 2 * ldd + 2 * n] = f32_to_bf16(src[2 * kk * lds + n]);
      dst[kk * 2 * ldd + 2 * n + 1] = 2 * kk + 1 < K ? f32_to_bf16(src[(2 * kk + 1) * lds + n]) : uint16_t(0);
    }
}

#endif

// ---------------------------------------------------------------------------------------
// transposes: plain loops, then 16 x 16 blocks through a register transpose network

void transpose_f32_ref(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                       const float* colscale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = colscale ? src[r * lds + c] * colscale[c] : src[r * lds + c];
}

void to_bf16_t_ref(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = f32_to_bf16(src[r * lds + c]);
}

void pack_vnni_t_ref(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                     const float* kscale) {
  for (int64_t kk = 0; kk < (K + 1) / 2; ++kk)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < 2; ++p) {
        const int64_t k = 2 * kk + p;
        const float x = k < K ? (kscale ? src[n * lds + k] * kscale[k] : src[n * lds + k]) : 0.f;
        dst[kk * 2 * ldd + 2 * n + p] = f32_to_bf16(x);
      }
}

#if defined(__AVX512F__)

namespace {

// In-register transpose of a 16 x 16 matrix of 32-bit words (row i in r[i]).
inline void tr16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_epi32(0xffff, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_maskz_unpacklo_epi64(0xff, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_maskz_shuffle_i32x4(0xffff, r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_maskz_shuffle_i32x4(0xffff, r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_maskz_shuffle_i32x4(0xffff, t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_maskz_shuffle_i32x4(0xffff, t[j], t[8 + j], 0xdd);
  }
}

}  // namespace

void transpose_f32(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                   const float* colscale) {
  const int64_t R = rows / 16 * 16, Cc = cols / 16 * 16;
  for (int64_t r0 = 0; r0 < R; r0 += 16)
    for (int64_t c0 = 0; c0 < Cc; c0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + (r0 + i) * lds + c0);
      tr16x16(r);
      for (int j = 0; j < 16; ++j) {
        __m512 x = (__m512)r[j];
        if (colscale) x = _mm512_mul_ps(x, _mm512_set1_ps(colscale[c0 + j]));
        _mm512_storeu_ps(dst + (c0 + j) * ldd + r0, x);
      }
    }
  // ragged edges
  if (Cc < cols) transpose_f32_ref(dst + Cc * ldd, ldd, src + Cc, lds, rows, cols - Cc, colscale ? colscale + Cc : nullptr);
  if (R < rows) transpose_f32_ref(dst + R, ldd, src + R * lds, lds, rows - R, Cc, colscale);
}

#else

void transpose_f32(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                   const float* colscale) {
  transpose_f32_ref(dst, ldd, src, lds, rows, cols, colscale);
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)

namespace {
// bf16 of lo (first 16) and hi (next 16) in natural order: word w = (x[2w], x[2w+1]).
inline __m512i cvt_pairs(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }
}  // namespace

void to_bf16_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  // word (c, w) of dst = (src[2w][c], src[2w+1][c]): interleave two source rows, then transpose
  // 16 x 16 words.
  alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  if (ldd % 2) return to_bf16_t_ref(dst, ldd, src, lds, rows, cols);
  const __m512i idx = _mm512_load_si512(kIdx);
  const int64_t R = rows / 32 * 32, Cc = cols / 16 * 16;
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  const int64_t ldw = ldd / 2;
  for (int64_t r0 = 0; r0 < R; r0 += 32)
    for (int64_t c0 = 0; c0 < Cc; c0 += 16) {
      __m512i r[16];
      for (int w = 0; w < 16; ++w) {
        const float* lo = src + (r0 + 2 * w) * lds + c0;
        r[w] = _mm512_permutexvar_epi16(idx, cvt_pairs(_mm512_loadu_ps(lo), _mm512_loadu_ps(lo + lds)));
      }
      tr16x16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(d + (c0 + j) * ldw + r0 / 2, r[j]);
    }
  if (Cc < cols) to_bf16_t_ref(dst + Cc * ldd, ldd, src + Cc, lds, rows, cols - Cc);
  if (R < rows) to_bf16_t_ref(dst + R, ldd, src + R * lds, lds, rows - R, Cc);
}

void pack_vnni_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                 const float* kscale) {
  // word (kk, n) = (B(2kk, n), B(2kk+1, n)) is contiguous in source row n: convert 32 values of
  // 16 rows into 16 x 16 words, transpose.
  const int64_t KK = K / 32 * 32, NN = N / 16 * 16;
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t k0 = 0; k0 < KK; k0 += 32)
    for (int64_t n0 = 0; n0 < NN; n0 += 16) {
      __m512i r[16];
      __m512 s0 = _mm512_set1_ps(1.f), s1 = s0;
      if (kscale) s0 = _mm512_loadu_ps(kscale + k0), s1 = _mm512_loadu_ps(kscale + k0 + 16);
      for (int i = 0; i < 16; ++i) {
        const float* row = src + (n0 + i) * lds + k0;
        r[i] = cvt_pairs(_mm512_mul_ps(_mm512_loadu_ps(row), s0), _mm512_mul_ps(_mm512_loadu_ps(row + 16), s1));
      }
      tr16x16(r);
      for (int w = 0; w < 16; ++w) _mm512_storeu_si512(d + (k0 / 2 + w) * ldd + n0, r[w]);
    }
  if (NN < N) {
    // columns NN..N of every pair-row
    for (int64_t kk = 0; kk < (K + 1) / 2; ++kk)
      for (int64_t n = NN; n < N; ++n)
        for (int64_t p = 0; p < 2; ++p) {
          const int64_t k = 2 * kk + p;
          const float x = k < K ? (kscale ? src[n * lds + k] * kscale[k] : src[n * lds + k]) : 0.f;
          dst[kk * 2 * ldd + 2 * n + p] = f32_to_bf16(x);
        }
  }
  if (KK < K) {
    // pair-rows KK/2.. for columns 0..NN
    for (int64_t kk = KK / 2; kk < (K + 1) / 2; ++kk)
      for (int64_t n = 0; n < NN; ++n)
        for (int64_t p = 0; p < 2; ++p) {
          const int64_t k = 2 * kk + p;
          const float x = k < K ? (kscale ? src[n * lds + k] * kscale[k] : src[n * lds + k]) : 0.f;
          dst[kk * 2 * ldd + 2 * n + p] = f32_to_bf16(x);
        }
  }
}

#else

void to_bf16_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  to_bf16_t_ref(dst, ldd, src, lds, rows, cols);
}
void pack_vnni_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                 const float* kscale) {
  pack_vnni_t_ref(dst, ldd, src, lds, K, N, kscale);
}

#endif

}  // namespace k3
