// Products with MXFP4 weight matrices (docs/model.md section 8; fixture mxfp4.json): W [out, in]
// stored as packed E2M1 nibbles [out, in/2] (byte j: element 2j low nibble, 2j+1 high) and
// one E8M0 scale per 32 values [out, in/32], the routed experts' checkpoint format.
//
// mxfp4_linear: y[rows, out] = x[rows, in] W^T (like `linear`, kernels/gemm.h), the nibbles
// decoded inside the dot product: no dequantised copy of W is written, so a product with a
// few rows (decode: one token per expert) reads W's 4.25 bits per weight once. Per SIMD
// target (Highway): on SSE4, AVX2 and NEON two byte shuffles of the 4-bit codes give the two
// high bytes of each weight's f32 (an E2M1 value is an f32 whose low 16 bits are 0), and a
// byte interleave, a shift and a mask make f32 lanes, no conversion instruction (x permuted
// once per call to meet the lanes' order); on AVX-512 the codes widen to int8 through a byte
// table; on the scalar baseline the value is built from the code's bits. Each group's sum is
// scaled once by 2^(s-127) (exact: a power of two). Rows of x go in blocks of up to 4, each
// weight row decoded once for the block, against a few weight rows at a time, and the weight
// rows 16 ahead are prefetched (an expert matrix is too short for the hardware prefetcher to
// ramp up). Meant for few rows; for many rows dequantise once (mxfp4_dequantize) and use a
// gemm.
// Reference: the row decoded by mxfp4_decode_row (core/dtype.h), dot products in double.
//
// mxfp4_dequantize: dst [rows, cols] f32, bit-identical to mxfp4_decode_row per row
// (E2M1 value times the scale is one exact product either way); the same decode per target.
#pragma once
#include <cstdint>

namespace k3 {

// y [rows, ldy] (first `out` columns; assigned, or added to with accumulate); x [rows, in];
// packed [out, in/2], scales [out, in/32]; in % 32 == 0.
void mxfp4_linear(float* y, const float* x, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t in,
                  int64_t out, int64_t ldy, bool accumulate = false);
template <typename T>
void mxfp4_linear_reference(T* y, const T* x, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t in,
                            int64_t out, int64_t ldy, bool accumulate = false);

// dst [rows, cols] (row stride cols); packed [rows, cols/2], scales [rows, cols/32].
void mxfp4_dequantize(float* dst, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols);
template <typename T>
void mxfp4_dequantize_reference(T* dst, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols);

}  // namespace k3
