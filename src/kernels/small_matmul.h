// A product for few rows against one weight matrix, with the rows stored as columns:
//   yt [out, n] = W [out, in] xt [in, n]          (y = x W^T, nn.Linear, transposed)
// Used by the routed experts at prefill sizes (kernels/moe.cpp: an expert sees ~T k / E rows,
// 37 at T = 2048 for K3's 896 experts, top-16), where a BLAS call spends much of its time
// packing. Storing the rows as columns puts the n rows side by side in vector lanes: the
// tile keeps R x NV accumulators (R weight rows, NV vectors of L columns, L the SIMD target's
// float width, the last vector cut at the edge), and every step broadcasts one weight per row
// and loads NV column vectors, so no horizontal sums and no packing are needed. Columns go in
// blocks of at most 4 vectors; R fills the target's register file. Every SIMD target has it.
// Reference: the same product with a double accumulator per output.
#pragma once
#include <cstdint>

namespace k3 {

// yt [out, ldy] (first n columns written); xt [in, ldx] (first n columns read); W [out, in].
void linear_cols(float* yt, const float* xt, const float* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                 int64_t ldy);
template <typename T>
void linear_cols_reference(T* yt, const T* xt, const T* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                           int64_t ldy);

}  // namespace k3
