// Few-row products (see gemv.h): AVX-512 tiles with a fixed per-element summation order.
#include "kernels/gemv.h"

#include <omp.h>

#include <algorithm>
#include <vector>

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

// Spread the N outputs over threads when the product is big enough to pay for a fork.
bool split_threads(int64_t N, int64_t K) { return !omp_in_parallel() && omp_get_max_threads() > 1 && N * K >= 65536; }

inline float finish(float s, float alpha, float beta, float c) { return beta == 0.f ? alpha * s : alpha * s + beta * c; }

#if defined(__AVX512F__)

inline float hsum(__m512 v) {  // fixed pairwise order
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

constexpr int64_t kPrefetch = 256;

// op(B) = B^T: outputs [n0, n0 + R) of rows [m0, m0 + NX); lane j of each accumulator sums
// k = j, j + 16, ... in order, the tail chunk masked (zeros).
template <int R, int NX>
void dot_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t m0, int64_t n0,
              int64_t K, float alpha, float beta) {
  __m512 acc[R][NX];
  #pragma GCC unroll 32
  for (auto& a : acc)
    #pragma GCC unroll 32
    for (auto& v : a) v = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if (NX == 1)  // decode: pure streaming; request each row's line kPrefetch floats ahead
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(B + (n0 + r) * ldb + k + kPrefetch), _MM_HINT_T0);
    __m512 x[NX];
    #pragma GCC unroll 32
    for (int i = 0; i < NX; ++i) x[i] = _mm512_loadu_ps(A + (m0 + i) * lda + k);
    #pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_loadu_ps(B + (n0 + r) * ldb + k);
      #pragma GCC unroll 32
      for (int i = 0; i < NX; ++i) acc[r][i] = _mm512_fmadd_ps(w, x[i], acc[r][i]);
    }
  }
  if (k < K) {
    const __mmask16 m = __mmask16((1u << (K - k)) - 1);
    __m512 x[NX];
    #pragma GCC unroll 32
    for (int i = 0; i < NX; ++i) x[i] = _mm512_maskz_loadu_ps(m, A + (m0 + i) * lda + k);
    #pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_maskz_loadu_ps(m, B + (n0 + r) * ldb + k);
      #pragma GCC unroll 32
      for (int i = 0; i < NX; ++i) acc[r][i] = _mm512_fmadd_ps(w, x[i], acc[r][i]);
    }
  }
  #pragma GCC unroll 32
  for (int i = 0; i < NX; ++i)
    #pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      float& c = C[(m0 + i) * ldc + n0 + r];
      c = finish(hsum(acc[r][i]), alpha, beta, c);
    }
}

// Output rows [n_begin, n_end) for rows [m0, m0 + NX).
template <int NX>
void dot_rows(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t m0,
              int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  constexpr int R = NX <= 2 ? 8 : 16 / NX;
  int64_t n = n_begin;
  for (; n + R <= n_end; n += R) dot_tile<R, NX>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta);
  for (; n < n_end; ++n) dot_tile<1, NX>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta);
}

// op(B) = B: columns [n0, n0 + 16 NV) (the last vector masked) of rows [m0, m0 + NX); each
// element one sequential sum over k.
template <int NV, int NX>
void axpy_tile(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t m0, int64_t n0,
               int64_t K, float alpha, float beta, __mmask16 last) {
  __m512 acc[NX][NV];
  #pragma GCC unroll 32
  for (auto& a : acc)
    #pragma GCC unroll 32
    for (auto& v : a) v = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, B + k * ldb + n0 + 16 * v) : _mm512_loadu_ps(B + k * ldb + n0 + 16 * v);
    #pragma GCC unroll 32
    for (int i = 0; i < NX; ++i) {
      const __m512 a = _mm512_set1_ps(A[(m0 + i) * lda + k]);
      #pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  #pragma GCC unroll 32
  for (int i = 0; i < NX; ++i)
    #pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      float* c = C + (m0 + i) * ldc + n0 + 16 * v;
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xffff);
      __m512 r = _mm512_mul_ps(va, acc[i][v]);
      if (beta != 0.f) r = _mm512_add_ps(r, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m, c)));
      _mm512_mask_storeu_ps(c, m, r);
    }
}

template <int NX>
void axpy_cols(float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t m0,
               int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  constexpr int NV = NX == 1 ? 8 : 16 / NX;
  int64_t n = n_begin;
  for (; n + 16 * NV <= n_end; n += 16 * NV)
    axpy_tile<NV, NX>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta, 0xffff);
  for (; n < n_end; n += 16) {
    const int64_t w = std::min<int64_t>(16, n_end - n);
    axpy_tile<1, NX>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta, __mmask16(w == 16 ? 0xffffu : (1u << w) - 1));
  }
}

// All M rows (blocks of 8, 4, 2, 1) for outputs [n_begin, n_end).
void rows_range(bool tb, float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t M,
                int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  for (int64_t m = 0; m < M;) {
    const int64_t left = M - m;
    const int nx = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
#define K3_ROWS(NX)                                                                      \
  (tb ? dot_rows<NX>(C, ldc, A, lda, B, ldb, m, n_begin, n_end, K, alpha, beta)          \
      : axpy_cols<NX>(C, ldc, A, lda, B, ldb, m, n_begin, n_end, K, alpha, beta))
    switch (nx) {
      case 8: K3_ROWS(8); break;
      case 4: K3_ROWS(4); break;
      case 2: K3_ROWS(2); break;
      default: K3_ROWS(1); break;
    }
#undef K3_ROWS
    m += nx;
  }
}

#else  // portable: the same orders in scalar code

void rows_range(bool tb, float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t M,
                int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n_begin; n < n_end; ++n) {
      float s;
      if (tb) {
        float lane[16] = {};
        for (int64_t k = 0; k < K; ++k) lane[k % 16] += B[n * ldb + k] * A[m * lda + k];
        for (int w = 8; w >= 1; w /= 2)
          for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
        s = lane[0];
      } else {
        s = 0.f;
        for (int64_t k = 0; k < K; ++k) s += A[m * lda + k] * B[k * ldb + n];
      }
      float& c = C[m * ldc + n];
      c = finish(s, alpha, beta, c);
    }
}

#endif

}  // namespace

void gemm_few_rows(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  K3_ASSERT(M >= 0 && N >= 0 && K >= 0, "gemm_few_rows: negative dimension");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta C (BLAS: beta = 0 clears)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = beta == 0.f ? 0.f : beta * C[m * ldc + n];
    return;
  }
  // Rows of op(A) contiguous: a transposed A ([K, M], stride lda) is gathered first.
  thread_local std::vector<float> at;
  if (ta) {
    if (at.size() < size_t(M * K)) at.resize(size_t(M * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) at[size_t(m * K + k)] = A[k * lda + m];
    A = at.data();
    lda = K;
  }
  if (!split_threads(N, K)) {
    rows_range(tb, C, ldc, A, lda, B, ldb, M, 0, N, K, alpha, beta);
    return;
  }
  // Output ranges in whole tiles (16 rows of B^T or 128 columns of B) per thread.
  const int64_t unit = tb ? 16 : 128;
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t units = (N + unit - 1) / unit;
    const int64_t b = std::min(N, units * t / nt * unit), e = std::min(N, units * (t + 1) / nt * unit);
    if (b < e) rows_range(tb, C, ldc, A, lda, B, ldb, M, b, e, K, alpha, beta);
  }
}

template <typename T>
void gemm_few_rows_reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                             const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(ta ? A[k * lda + m] : A[m * lda + k]) * double(tb ? B[n * ldb + k] : B[k * ldb + n]);
      T& c = C[m * ldc + n];
      c = beta == T(0) ? T(double(alpha) * s) : T(double(alpha) * s + double(beta) * double(c));
    }
}

template void gemm_few_rows_reference<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                             const float*, int64_t, float, float*, int64_t);
template void gemm_few_rows_reference<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                              const double*, int64_t, double, double*, int64_t);

}  // namespace k3
