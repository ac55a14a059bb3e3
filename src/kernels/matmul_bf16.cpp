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

void transpose_f32(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  // 16x16 blocks keep both sides' cache lines live; the compiler vectorises the gathers poorly
  // but these transposes are a few percent of a chunk's work.
  constexpr int64_t B = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += B)
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
      const int64_t r1 = std::min(rows, r0 + B), c1 = std::min(cols, c0 + B);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * ldd + r] = src[r * lds + c];
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
constexpr int kMrBf = 4, kNvBf = 4;

struct TableBf16 {
  UkrBf16 f[kMrBf][kNvBf];
};
template <int... R>
constexpr TableBf16 bf16_table(std::integer_sequence<int, R...>) {
  TableBf16 t{};
  ((t.f[R][0] = &ukr_bf16<R + 1, 1>, t.f[R][1] = &ukr_bf16<R + 1, 2>, t.f[R][2] = &ukr_bf16<R + 1, 3>,
    t.f[R][3] = &ukr_bf16<R + 1, 4>),
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
    const float* cs = colscale ? colscale + n0 : nullptr;
    for (int64_t i0 = 0; i0 < M; i0 += kMrBf) {
      const int64_t mr = std::min<int64_t>(kMrBf, M - i0);
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

void to_bf16_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  constexpr int64_t B = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += B)
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
      const int64_t r1 = std::min(rows, r0 + B), c1 = std::min(cols, c0 + B);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * ldd + r] = f32_to_bf16(src[r * lds + c]);
    }
}

void pack_vnni_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                 const float* kscale) {
  // Pair (k, k+1) of column n is contiguous in the source row n: convert it into one 32-bit
  // word and transpose words: word (kk, n) of the packed matrix.
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t n = 0; n < N; ++n) {
    const float* s = src + n * lds;
    for (int64_t kk = 0; kk < (K + 1) / 2; ++kk) {
      const int64_t k = 2 * kk;
      const float lo = kscale ? s[k] * kscale[k] : s[k];
      const float hi = k + 1 < K ? (kscale ? s[k + 1] * kscale[k + 1] : s[k + 1]) : 0.f;
      d[kk * ldd + n] = uint32_t(f32_to_bf16(lo)) | (uint32_t(f32_to_bf16(hi)) << 16);
    }
  }
}

}  // namespace k3
