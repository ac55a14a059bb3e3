// Causal depthwise short convolution with fused SiLU and carried state (docs/model.md section 3;
// fixture ops/shortconv.json). Channel c of token t:
//   pre[t, c] = sum_{j<K} w[c, j] * x_ext[t - (K-1) + j, c],   y[t, c] = SiLU(pre[t, c]),
// taps ordered oldest to newest, where x_ext is the carried state (the last K-1 inputs of the
// previous call, oldest first) followed by x. On return `state` holds the last K-1 inputs of
// x_ext, so a prefill followed by single-token calls equals one call over all tokens.
// The backward (shortconv_silu_backward) differentiates one forward call: y w.r.t. x, w and
// the incoming state (the gradient of the outgoing state, a copy of inputs, is not taken).
#pragma once
#include <cstdint>

namespace k3 {

// y     [Tn, C]      output, SiLU(pre)
// pre   [Tn, C]      optional (may be null): the pre-SiLU conv output, saved for backward
// state [C, K-1]     in/out: the last K-1 inputs per channel, oldest first (zero for a fresh
//                    sequence); the fixture's state_after [1, C, K-1] has this layout
// x     [Tn, C]      input, token-major (must not alias y or pre)
// w     [C, K]       depthwise weights (nn.Conv1d weight [C, 1, K])
template <typename T>
void shortconv_silu_forward(T* y, T* pre, T* state, const T* x, const T* w, int64_t Tn, int64_t C, int64_t K);

// Backward of one shortconv_silu_forward call, with dpre = dy * SiLU'(pre):
//   dx[s, c]      = sum_j w[c, j] dpre[s + (K-1) - j, c]          (terms with that t < Tn)
//   dw[c, j]     += sum_t dpre[t, c] x_ext[t - (K-1) + j, c]       (accumulated)
//   dstate0[c, m] = sum_j w[c, j] dpre[m - j, c]                   (0 <= m - j < Tn)
// dx [Tn, C] assigned (must not alias dy or pre); dw [C, K] accumulated; dstate0 [C, K-1]
// assigned, may be null; dy, pre [Tn, C] (pre as saved by the forward); state0 [C, K-1] the
// state the forward was called with (may be null for a zero state); x [Tn, C]; w [C, K].
template <typename T>
void shortconv_silu_backward(T* dx, T* dw, T* dstate0, const T* dy, const T* pre, const T* state0, const T* x,
                             const T* w, int64_t Tn, int64_t C, int64_t K);

}  // namespace k3
