// Attention-Residual read (docs/model.md section 2; fixture ops/attnres.json). Over S sources
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

// out [T, d] = sum_s alpha[t, s] sources[s][t] with a forward's saved alpha [T, S]: the read
// recomputed bit for bit (the training record keeps alpha, not the read's output).
template <typename T>
void attn_res_mix(T* out, const T* alpha, const T* const* sources, int64_t S, int64_t Tn, int64_t d);

// Backward of attn_res_forward, from its saved alpha [T, S]. dsources: S pointers, each
// [T, d], ACCUMULATED (+=): the sources are streams summed into, so the caller's gradient of
// a block or of the partial sum just grows; none may alias dout. dw_norm, dw_proj [d] (+=).
// The two parameter vectors' gradients are kept apart (docs/model.md section 2):
//   dalpha_s = dout . src_s;  dscore_s = alpha_s (dalpha_s - sum_s' alpha_s' dalpha_s')
//   dsrc_s  += alpha_s dout + dscore_s d score_s / d src_s
//   dw_p    += sum dscore_s rstd_s w_n * src_s;   dw_n += sum dscore_s rstd_s w_p * src_s
// Deterministic: rows are parallel for dsources, columns for the parameter gradients (each
// summed over tokens and sources in order).
template <typename T>
void attn_res_backward(T* const* dsources, T* dw_norm, T* dw_proj, const T* dout, const T* alpha,
                       const T* const* sources, int64_t S, const T* w_norm, const T* w_proj, int64_t Tn, int64_t d,
                       double eps);

}  // namespace k3
