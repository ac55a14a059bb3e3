// Dense SiTU-GLU feed-forward (layer 0 of K3, and the fused shared experts of every MoE
// layer; docs/model.md section 5): y = W_down SiTU(W_gate x, W_up x), forward and backward.
#pragma once
#include <cstdint>

#include "kernels/ops.h"
#include "kernels/weight_mat.h"

namespace k3 {

// out [T, d] (assigned, or += if accumulate); gu [T, 2I] saved [W_gate x | W_up x];
// act [T, I] saved SiTU output; x [T, d]; gate, up [I, d]; down [d, I] as held (f32 or bf16).
// b1, b2: SiTU caps. Projections go through kernels/gemm.h; instantiated for float and double.
template <typename T>
void dense_ffn_forward(const OpsT<T>& ops, T* out, T* gu, T* act, const T* x, const MatT<T>& gate,
                       const MatT<T>& up, const MatT<T>& down, int64_t Tn, int64_t d, int64_t I, double b1, double b2,
                       bool accumulate = false);
template <typename T>
void dense_ffn_forward(T* out, T* gu, T* act, const T* x, const MatT<T>& gate, const MatT<T>& up,
                       const MatT<T>& down, int64_t Tn, int64_t d, int64_t I, double b1, double b2,
                       bool accumulate = false) {
  dense_ffn_forward<T>(cpu_ops<T>(), out, gu, act, x, gate, up, down, Tn, d, I, b1, b2, accumulate);
}

// Backward of dense_ffn_forward from its saved gu and act (training keeps both; they are the
// forward's "saved activations"). dx [T, d] assigned (or += if accumulate_dx: the shared
// experts add onto the MoE block's dx); dgate, dup [I, d] and ddown [d, I] accumulated (+=);
// dgu [T, 2I] and dact [T, I] are assigned work arrays (the gradients of gu and act).
template <typename T>
void dense_ffn_backward(T* dx, T* dgate, T* dup, T* ddown, T* dgu, T* dact, const T* dout, const T* gu, const T* act,
                        const T* x, const T* gate, const T* up, const T* down, int64_t Tn, int64_t d, int64_t I,
                        double b1, double b2, bool accumulate_dx = false);
// dense_ffn_backward in its two halves (the same operations in the same order): the weights'
// gradients and dgu (independent of dx: expert-parallel training runs it while rows travel),
// then dx from dgu.
template <typename T>
void dense_ffn_backward_weights(T* dgate, T* dup, T* ddown, T* dgu, T* dact, const T* dout, const T* gu, const T* act,
                                const T* x, const T* down, int64_t Tn, int64_t d, int64_t I, double b1, double b2);
template <typename T>
void dense_ffn_backward_input(T* dx, const T* dgu, const T* gate, const T* up, int64_t Tn, int64_t d, int64_t I,
                              bool accumulate_dx);

}  // namespace k3
