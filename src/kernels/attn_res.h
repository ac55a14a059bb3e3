// Attention-Residual read (K3_REFERENCE section 2; fixture ops/attnres.json). Over S sources
// (the completed block sums, then the current partial sum), per token:
//   score_s = w_p . (w_n * RMSNorm(src_s))     (no 1/sqrt(d), no temperature; eps like rms_norm_eps)
//   alpha   = softmax_s(score)
//   out     = sum_s alpha_s * src_s             (over the RAW sources)
// w_n and w_p fold into one vector (the fixture's fold_hint); they are kept apart here so the
// backward pass can give each its gradient.
#pragma once
#include <cstdint>

namespace k3 {

// out [T, d]; alpha [T, S] (saved; may be null); sources: S pointers, each [T, d] with row
// stride d (no copy of the block stack needed); w_norm, w_proj [d]. out must not alias a source.
template <typename T>
void attn_res_forward(T* out, T* alpha, const T* const* sources, int64_t S, const T* w_norm, const T* w_proj,
                      int64_t Tn, int64_t d, double eps);

}  // namespace k3
