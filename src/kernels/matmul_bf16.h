// Small dense products for cache-resident tiles (the chunked KDA kernel's 16x16 .. 128x128
// blocks, docs/benchmarks.md "KDA chunked kernel"), in f32 and in bf16 with f32 accumulation.
// Row-major throughout. For these sizes a register-blocked micro-kernel called in place
// beats a library call per tile (no per-call setup, fused epilogues); the measured
// comparison against OpenBLAS and oneDNN is in docs/benchmarks.md.
//
//   C[M, N] = (accumulate ? C : 0) + alpha * (op(A)[M, K] B[K, N]) o colscale[N]
//
// mm_f32:  A(i, k) = A[i*lda + k], or A[k*lda + i] when a_trans; B(k, n) = B[k*ldb + n].
// mm_bf16: A bf16, A(i, k) = A[i*lda + k] (lda even, so (k, k+1) pairs are 4-byte words);
//          B "VNNI"-packed bf16: B(k, n) = Bp[(k/2)*2*ldb + 2n + (k&1)] (ldb = packed row
//          width in columns); K is rounded up to even, the pad row must hold zeros
//          (pack_vnni writes it). Products are exact in f32; sums are f32 (AVX512-BF16
//          vdpbf16ps where the CPU has it, else the same arithmetic widened in registers).
// N must be a multiple of 16. colscale may be null (all ones). tri describes A:
//   Lower: A(i, k) = 0 for k > i, Upper: A(i, k) = 0 for k < i; the kernel skips the whole
//   k-steps that hold only zeros for a block of rows (the skipped part is never read, but
//   at most one stored zero past the diagonal is, so that triangle must be stored as zeros).
// The *_ref functions are the plain loops with the same contract; tests compare them.
#pragma once
#include <cstdint>

namespace k3 {

enum class Tri : uint8_t { None, Lower, Upper };

void mm_f32(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb, int64_t M,
            int64_t N, int64_t K, float alpha, bool accumulate, Tri tri = Tri::None, const float* colscale = nullptr);
void mm_f32_ref(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb,
                int64_t M, int64_t N, int64_t K, float alpha, bool accumulate, Tri tri = Tri::None,
                const float* colscale = nullptr);

void mm_bf16(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
             int64_t N, int64_t K, float alpha, bool accumulate, Tri tri = Tri::None, const float* colscale = nullptr);
void mm_bf16_ref(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
                 int64_t N, int64_t K, float alpha, bool accumulate, Tri tri = Tri::None,
                 const float* colscale = nullptr);

// Operand packing (f32 -> bf16, round to nearest even).
// dst[r*ldd + c] = bf16(src[r*lds + c] * colscale[c]), r < rows, c < cols (colscale may be null).
void to_bf16(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
             const float* colscale = nullptr);
// Transposed: dst[c*ldd + r] = bf16(src[r*lds + c]).
void to_bf16_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols);
// B operand from a k-major source, B(k, n) = src[k*lds + n]: VNNI layout above with ldb = ldd;
// writes ceil(K/2) pair-rows (a zero pad row when K is odd).
void pack_vnni(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N);
// The same through a register transpose (f32) then the row conversion; the *_ref
// versions below are the plain loops (tests compare).
// B operand from an n-major source, B(k, n) = src[n*lds + k] * kscale[k] (kscale may be null).
void pack_vnni_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                 const float* kscale = nullptr);

// f32 transpose: dst[c*ldd + r] = src[r*lds + c] * colscale[c] (colscale may be null).
void transpose_f32(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                   const float* colscale = nullptr);

void to_bf16_t_ref(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols);
void pack_vnni_t_ref(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                     const float* kscale = nullptr);
void transpose_f32_ref(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                       const float* colscale = nullptr);

// Whether mm_bf16 runs on AVX512-BF16 instructions now (the CPU has them and AVX-512 is not
// disabled by a forced lower SIMD target); otherwise bf16 is widened in registers.
bool mm_bf16_native();

}  // namespace k3
