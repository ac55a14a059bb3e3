#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/blas_core.h"
#include "kernels/gemv.h"

namespace k3 {

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (M <= kGemvMaxRows) {
    // Few rows (decode steps, short prefills): stream B once per row block without packing
    // it, each element in one fixed order (kernels/gemv.h).
    gemm_few_rows(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  blas_choose_core();
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

int64_t bf16_panel_rows(int64_t K) {
  constexpr int64_t kPanelFloats = int64_t(1) << 20;  // about 4 MB of widened weights
  return std::max<int64_t>(16, kPanelFloats / std::max<int64_t>(K, 1) / 16 * 16);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const Mat& B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!B.is_bf16()) return gemm(ta, tb, M, N, K, alpha, A, lda, B.f, ldb, beta, C, ldc);
  if (M == 0 || N == 0) return;
  if (M <= kGemvMaxRows) return gemm_few_rows_bf16(ta, tb, M, N, K, alpha, A, lda, B.bf16, ldb, beta, C, ldc);
  blas_choose_core();
  // Panels of about 4 MB of widened weights: columns of C (rows of B) when B is [N, K]
  // (trans_b), else a range of k (rows of B [K, N]) accumulated into C.
  constexpr int64_t kPanelFloats = int64_t(1) << 20;
  thread_local std::vector<float> panel;
  if (tb) {
    const int64_t nb = bf16_panel_rows(K);
    if (panel.size() < size_t(std::min(nb, N) * K)) panel.resize(size_t(std::min(nb, N) * K));
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
      const int64_t n = std::min(nb, N - n0);
      for (int64_t r = 0; r < n; ++r) widen_bf16(panel.data() + r * K, B.bf16 + (n0 + r) * ldb, K);
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasTrans, int(M), int(n), int(K), alpha, A,
                  int(lda), panel.data(), int(K), beta, C + n0, int(ldc));
    }
  } else {
    const int64_t kb = std::max<int64_t>(16, kPanelFloats / std::max<int64_t>(N, 1));
    if (panel.size() < size_t(std::min(kb, K) * N)) panel.resize(size_t(std::min(kb, K) * N));
    if (K == 0) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < N; ++j) C[m * ldc + j] = beta == 0.f ? 0.f : beta * C[m * ldc + j];
      return;
    }
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
      const int64_t k = std::min(kb, K - k0);
      for (int64_t r = 0; r < k; ++r) widen_bf16(panel.data() + r * N, B.bf16 + (k0 + r) * ldb, N);
      const float* a = ta ? A + k0 * lda : A + k0;
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, int(M), int(N), int(k), alpha, a,
                  int(lda), panel.data(), int(N), k0 == 0 ? beta : 1.f, C, int(ldc));
    }
  }
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const MatT<double>& B, int64_t ldb, double beta, double* C, int64_t ldc) {
  gemm(ta, tb, M, N, K, alpha, A, lda, static_cast<const double*>(B), ldb, beta, C, ldc);
}

void mat_row(float* dst, const Mat& W, int64_t r, int64_t n) {
  if (W.is_bf16())
    widen_bf16(dst, W.bf16 + r * n, n);
  else
    std::memcpy(dst, W.f + r * n, size_t(n) * sizeof(float));
}

void mat_row(double* dst, const MatT<double>& W, int64_t r, int64_t n) {
  std::memcpy(dst, static_cast<const double*>(W) + r * n, size_t(n) * sizeof(double));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

}  // namespace k3
