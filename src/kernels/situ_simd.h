// Vectorised SiTU for the float inference and training forwards (docs/model.md section 5;
// fixture ops/situ_glu.json): out[i] = b1 tanh(g[i]/b1) sigmoid(g[i]) * b2 tanh(u[i]/b2),
// the scalar `situ` of kernels/activations.h computed a vector at a time on every SIMD target
// (Highway; core/simd_target.h). libm's tanhf/expm1f per element cost more than the expert
// products around them at prefill sizes; here exp and tanh are kernels/simd/vec-inl.h's
// (range-reduced exp with a degree-7 polynomial, Cephes tanhf's polynomial below |x| = 0.625,
// else (1 - e) / (1 + e) with e = exp(-2|x|)): a few ulp from the correctly rounded values,
// NaN propagated, +-inf saturated like libm. Tails go through the same vector code.
// Reference: the scalar `situ` (activations.h) in the same scalar type; tests compare them.
// The backward (situ_backward_fast) is the scalar `situ_grad` the same way: the training
// backward of every expert and FFN row runs it, and libm's tanhf/expm1f there took about a
// tenth of a mid-size training step. Its 1 - tanh^2 and 1 - sigmoid are computed without
// cancellation on every target (the scalar situ_grad's 1 - th * th loses all digits once
// |g| / b1 > 9 in float).
#pragma once
#include <cstdint>

namespace k3 {

// out [n] = SiTU(gate [n], up [n]) elementwise (out may alias neither input).
void situ_forward_fast(float* out, const float* gate, const float* up, int64_t n, double b1, double b2);
template <typename T>
void situ_forward_reference(T* out, const T* gate, const T* up, int64_t n, double b1, double b2);

// dgate[i] = dout[i] * dSiTU/dg (gate[i], up[i]), dup[i] = dout[i] * dSiTU/du (assigned; the
// outputs may alias neither input).
void situ_backward_fast(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                        double b1, double b2);
template <typename T>
void situ_backward_reference(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, double b1,
                             double b2);

// The [gate | up] row layout of situ_glu_forward / situ_glu_backward (activations.h), rows of
// width 2F: the vectorised functions above per row; float only.
void situ_glu_forward_fast(float* out, const float* gu, int64_t rows, int64_t F, double b1, double b2);
void situ_glu_backward_fast(float* dgu, const float* dout, const float* gu, int64_t rows, int64_t F, double b1,
                            double b2);

}  // namespace k3
