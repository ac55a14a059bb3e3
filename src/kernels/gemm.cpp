#include "kernels/gemm.h"

#include <cblas.h>

#include <algorithm>

namespace k3 {

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (M == 1 && K > 0) {
    // One row (a decode step's projections): sgemv streams op(B) once, where sgemm would
    // first pack all of it (several times slower at M = 1). C row = alpha A row op(B) + beta C.
    // With beta = 0, C's old contents must not leak in (0 * NaN): clear it first.
    if (beta == 0.f) std::fill(C, C + N, 0.f);
    cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, int(tb ? N : K), int(tb ? K : N), alpha, B, int(ldb),
                A, ta ? int(lda) : 1, beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

}  // namespace k3
