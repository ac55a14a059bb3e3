// Matrix products through BLAS (OpenBLAS, OpenMP build). Row-major everywhere.
// The model's weights are stored like nn.Linear: W [out, in]; `linear` computes
// y[T, out] = x[T, in] W^T (+ y if accumulate).
#pragma once
#include <cstdint>

#include "kernels/weight_mat.h"

namespace k3 {

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major, lda/ldb/ldc are row strides.
// float with M <= kGemvMaxRows: kernels/gemv.h (decode-sized products stream B instead of
// packing it, and each element's rounding is independent of M up to that size, so short
// prefills and decode steps reproduce a full forward exactly); larger M: OpenBLAS sgemm.
inline constexpr int64_t kGemvMaxRows = 32;
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
          const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// B as held (kernels/weight_mat.h): f32 as above; bf16 with M <= kGemvMaxRows through the
// few-row tiles widening B in registers (the same order as f32: bitwise equal to the f32
// product on the widened B), else panels of B widened to f32 (a few MB per panel, per thread
// buffer) and multiplied by sgemm, so a prefill reads each weight once and converts it once.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const Mat& B, int64_t ldb, float beta, float* C, int64_t ldc);
// Rows of B [N, K] (trans_b) per widened panel in that bf16 path: a product split into row
// blocks of B that are multiples of it makes the same sgemm calls as the whole product.
int64_t bf16_panel_rows(int64_t K);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const MatT<double>& B, int64_t ldb, double beta, double* C, int64_t ldc);

// y[T, out] = x[T, in] W[out, in]^T  (accumulate: y += ...)
template <typename T>
void linear(T* y, const T* x, const T* W, int64_t rows, int64_t in, int64_t out, bool accumulate = false) {
  gemm(false, true, rows, out, in, T(1), x, in, W, in, accumulate ? T(1) : T(0), y, out);
}
template <typename T>
void linear(T* y, const T* x, const MatT<T>& W, int64_t rows, int64_t in, int64_t out, bool accumulate = false) {
  gemm(false, true, rows, out, in, T(1), x, in, W, in, accumulate ? T(1) : T(0), y, out);
}
// dst [n] = row `r` of a [rows, n] matrix as f32 (an embedding lookup).
void mat_row(float* dst, const Mat& W, int64_t r, int64_t n);
void mat_row(double* dst, const MatT<double>& W, int64_t r, int64_t n);

// Backward of `linear`: dW += dy^T x (parameter gradients accumulate); dx = dy W, or
// dx += dy W when accumulate_dx (several consumers of x).
template <typename T>
void linear_backward(T* dx, T* dW, const T* dy, const T* x, const T* W, int64_t rows, int64_t in, int64_t out,
                     bool accumulate_dx) {
  gemm(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dW, in);
  gemm(false, false, rows, in, out, T(1), dy, out, W, in, accumulate_dx ? T(1) : T(0), dx, in);
}

}  // namespace k3
