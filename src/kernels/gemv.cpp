// Few-row products (see gemv.h): register tiles with a fixed per-element summation order,
// compiled once per SIMD target (Highway dynamic dispatch).
#include "kernels/gemv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemv.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {
namespace {

inline float finish(float s, float alpha, float beta, float c) { return beta == 0.f ? alpha * s : alpha * s + beta * c; }

// Bytes ahead on each streamed row of B (decode). Far ahead pays: 1 KB gave 16.1 GB/s, 4 KB
// 20.6, 16 KB 24.0, 32 KB 24.2, 64 KB 23.3 (bf16 gemv, 2 threads, Zen 2; stream read 26.5).
constexpr int64_t kPrefetchBytes = 16384;

// B elements as f32 lanes: f32 as is, bf16 widened in registers (a bf16 is the top half of an
// f32); the tails read only their n elements.
using DU32 = hn::RebindToUnsigned<DF>;
using DU16 = hn::Rebind<uint16_t, DF>;
HWY_INLINE VF LoadB(DF d, const float* p) { return hn::LoadU(d, p); }
HWY_INLINE VF LoadB(DF d, const uint16_t* p) {
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(DU32(), hn::LoadU(DU16(), p))));
}
HWY_INLINE VF LoadBTail(DF d, const float* p, size_t n) { return LoadTail(d, p, n); }
HWY_INLINE VF LoadBTail(DF d, const uint16_t* p, size_t n) {
  HWY_ALIGN uint16_t buf[hn::MaxLanes(DF())] = {};
  std::memcpy(buf, p, n * sizeof(uint16_t));
  return LoadB(d, buf);
}

// op(B) = B^T: outputs [n0, n0 + R) of rows [m0, m0 + NX); lane j of each accumulator sums
// k = j, j + L, ... in order, the tail chunk zero-padded.
template <int R, int NX, typename TB>
HWY_INLINE void dot_tile(float* C, int64_t ldc, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t m0,
                         int64_t n0, int64_t K, float alpha, float beta) {
  constexpr int64_t kPrefetch = kPrefetchBytes / int64_t(sizeof(TB));
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d));
  VF acc[R][NX];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NX; ++i) acc[r][i] = hn::Zero(d);
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    if (NX == 1)  // decode: pure streaming; request each row's line kPrefetch floats ahead
      for (int r = 0; r < R; ++r) hwy::Prefetch(B + (n0 + r) * ldb + k + kPrefetch);
    VF x[NX];
    for (int i = 0; i < NX; ++i) x[i] = hn::LoadU(d, A + (m0 + i) * lda + k);
    for (int r = 0; r < R; ++r) {
      const VF w = LoadB(d, B + (n0 + r) * ldb + k);
      for (int i = 0; i < NX; ++i) acc[r][i] = hn::MulAdd(w, x[i], acc[r][i]);
    }
  }
  if (k < K) {
    const size_t left = size_t(K - k);
    VF x[NX];
    for (int i = 0; i < NX; ++i) x[i] = LoadTail(d, A + (m0 + i) * lda + k, left);
    for (int r = 0; r < R; ++r) {
      const VF w = LoadBTail(d, B + (n0 + r) * ldb + k, left);
      for (int i = 0; i < NX; ++i) acc[r][i] = hn::MulAdd(w, x[i], acc[r][i]);
    }
  }
  for (int i = 0; i < NX; ++i)
    for (int r = 0; r < R; ++r) {
      float& c = C[(m0 + i) * ldc + n0 + r];
      c = finish(HSum(d, acc[r][i]), alpha, beta, c);
    }
}

// Output rows [n_begin, n_end) for rows [m0, m0 + NX). R x NX accumulators take half the
// register file (at most 8 rows of B at once).
template <int NX, typename TB>
void dot_rows(float* C, int64_t ldc, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t m0,
              int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  constexpr int R = std::max(1, std::min(8, kVecRegs / 2 / NX));
  int64_t n = n_begin;
  for (; n + R <= n_end; n += R) dot_tile<R, NX, TB>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta);
  for (; n < n_end; ++n) dot_tile<1, NX, TB>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta);
}

// op(B) = B: columns [n0, n0 + L NV) of rows [m0, m0 + NX) (the last vector `last` wide);
// each element one sequential sum over k.
template <int NV, int NX, typename TB>
HWY_INLINE void axpy_tile(float* C, int64_t ldc, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t m0,
                          int64_t n0, int64_t K, float alpha, float beta, size_t last) {
  const DF d;
  const size_t L = hn::Lanes(d);
  VF acc[NX][NV];
  for (int i = 0; i < NX; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    VF b[NV];
    for (int v = 0; v < NV; ++v) {
      const TB* p = B + k * ldb + n0 + int64_t(L) * v;
      b[v] = (v == NV - 1 && last < L) ? LoadBTail(d, p, last) : LoadB(d, p);
    }
    for (int i = 0; i < NX; ++i) {
      const VF a = hn::Set(d, A[(m0 + i) * lda + k]);
      for (int v = 0; v < NV; ++v) acc[i][v] = hn::MulAdd(a, b[v], acc[i][v]);
    }
  }
  const VF va = hn::Set(d, alpha), vb = hn::Set(d, beta);
  for (int i = 0; i < NX; ++i)
    for (int v = 0; v < NV; ++v) {
      float* c = C + (m0 + i) * ldc + n0 + int64_t(L) * v;
      const bool tail = v == NV - 1 && last < L;
      VF r = hn::Mul(va, acc[i][v]);
      if (beta != 0.f) r = hn::MulAdd(vb, tail ? LoadTail(d, c, last) : hn::LoadU(d, c), r);
      if (tail)
        StoreTail(d, r, c, last);
      else
        hn::StoreU(r, d, c);
    }
}

template <int NX, typename TB>
void axpy_cols(float* C, int64_t ldc, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t m0,
               int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  constexpr int NV = std::max(1, NX == 1 ? kVecRegs / 4 : kVecRegs / 2 / NX);
  const int64_t L = int64_t(hn::Lanes(DF()));
  int64_t n = n_begin;
  for (; n + L * NV <= n_end; n += L * NV)
    axpy_tile<NV, NX, TB>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta, size_t(L));
  for (; n < n_end; n += L)
    axpy_tile<1, NX, TB>(C, ldc, A, lda, B, ldb, m0, n, K, alpha, beta, size_t(std::min<int64_t>(L, n_end - n)));
}

// All M rows (blocks of 8, 4, 2, 1) for outputs [n_begin, n_end).
template <typename TB>
void rows_range(bool tb, float* C, int64_t ldc, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t M,
                int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  for (int64_t m = 0; m < M;) {
    const int64_t left = M - m;
    const int nx = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
#define K3_ROWS(NX)                                                                      \
  (tb ? dot_rows<NX, TB>(C, ldc, A, lda, B, ldb, m, n_begin, n_end, K, alpha, beta)      \
      : axpy_cols<NX, TB>(C, ldc, A, lda, B, ldb, m, n_begin, n_end, K, alpha, beta))
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

}  // namespace

void RowsRange(bool tb, float* C, int64_t ldc, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t M,
               int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  rows_range(tb, C, ldc, A, lda, B, ldb, M, n_begin, n_end, K, alpha, beta);
}
void RowsRangeBf16(bool tb, float* C, int64_t ldc, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                   int64_t M, int64_t n_begin, int64_t n_end, int64_t K, float alpha, float beta) {
  rows_range(tb, C, ldc, A, lda, B, ldb, M, n_begin, n_end, K, alpha, beta);
}

// dst [n] = the bf16 values src [n] as f32 (exact).
void WidenBf16(float* HWY_RESTRICT dst, const uint16_t* HWY_RESTRICT src, int64_t n) {
  const DF d;
  const size_t L = hn::Lanes(d);
  size_t i = 0;
  for (; i + L <= size_t(n); i += L) hn::StoreU(LoadB(d, src + i), d, dst + i);
  if (i < size_t(n)) StoreTail(d, LoadBTail(d, src + i, size_t(n) - i), dst + i, size_t(n) - i);
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3 {

HWY_EXPORT(RowsRange);
HWY_EXPORT(RowsRangeBf16);
HWY_EXPORT(WidenBf16);

namespace {

// Spread the N outputs over threads when the product is big enough to pay for a fork.
bool split_threads(int64_t N, int64_t K) { return !omp_in_parallel() && omp_get_max_threads() > 1 && N * K >= 65536; }

template <typename TB, typename Fn>
void few_rows(Fn rows_range, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const TB* B, int64_t ldb, float beta, float* C, int64_t ldc) {
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

}  // namespace

void gemm_few_rows(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  few_rows(HWY_DYNAMIC_DISPATCH(RowsRange), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_few_rows_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                        const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  few_rows(HWY_DYNAMIC_DISPATCH(RowsRangeBf16), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void widen_bf16(float* dst, const uint16_t* src, int64_t n) { HWY_DYNAMIC_DISPATCH(WidenBf16)(dst, src, n); }

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
#endif  // HWY_ONCE
