// Products with few rows, C[M, N] = alpha A[M, K] op(B) + beta C (row-major, like gemm in
// kernels/gemm.h, which sends float products with M <= kGemvMaxRows here): the decode step's
// projections (M = 1) and short prefills.
//  - Bandwidth: B is streamed once per block of up to 8 rows of A, with no packing (BLAS sgemm
//    packs all of B first, several times slower at M = 1); at M = 1 each row of B^T is
//    prefetched 16 KB ahead (gemv.cpp has the measured distances).
//  - Batch invariance: every element of C is summed in one fixed order that does not depend on
//    M, on the row blocking or on the thread count, so a row computed alone equals the same row
//    computed with others (a short prefill followed by decode steps reproduces one forward over
//    the same tokens exactly; tests/model/test_kda_mixer.cpp checks the carried conv inputs).
//    op(B) = B^T (nn.Linear, B [N, K]): one vector of L lanes (L = the SIMD target's float
//    width: 16 AVX-512, 8 AVX2, 4 SSE4 / EMU128), lane j summing k = j, j + L, ... in order
//    (the K tail zero-padded), then the target's fixed reduction of the lanes. op(B) = B
//    (B [K, N]): one sequential sum over k per element. Then C = alpha s (+ beta C). The order
//    is fixed per target; results differ between targets within the reference tolerance.
//  - Threads: the N outputs are split across OpenMP threads outside parallel regions (each
//    element stays on one thread).
// Every SIMD target (core/simd_target.h) has these tiles, sized to its register file.
// Reference: the same product with double accumulation.
#pragma once
#include <cstdint>

namespace k3 {

void gemm_few_rows(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same with B held as bf16 (widened in registers; the same summation order, so equal to
// gemm_few_rows on the widened B bit for bit).
void gemm_few_rows_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
// dst [n] = src [n] (bf16) as f32, exact; vectorised on every SIMD target.
void widen_bf16(float* dst, const uint16_t* src, int64_t n);
template <typename T>
void gemm_few_rows_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                             int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

}  // namespace k3
