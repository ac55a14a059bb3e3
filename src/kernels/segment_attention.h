// Bidirectional softmax attention over packed segments (the vision encoder's variable-length
// attention, docs/model.md section 11): the tokens of several images sit in one sequence, and
// a token attends to every token of its own segment and to no other (a block-diagonal mask,
// as flash_attn_varlen_func with cu_seqlens and causal=False in the released encoder).
//   s_ij = scale q_i . k_j (i, j in one segment),  p = softmax_j(s),  o_i = sum_j p_ij v_j
// q, k, v are rows of a packed buffer at row stride `ld_in` (the qkv projection's [L, 3, H, hd]
// rows: q at +0, k at +H hd, v at +2 H hd), heads at stride hd; o is [L, H hd].
// cu [n + 1]: segment boundaries (cu[0] = 0, cu[n] = L).
#pragma once
#include <cstdint>
#include <vector>

namespace k3 {

struct SegmentAttnDims {
  int64_t H = 1, hd = 0;
  int64_t ld_in = 0;  // row stride of q, k, v
  double scale = 1.0;
};

// Plain reference: scalar loops per segment, head and query, max-subtracted softmax.
template <typename T>
void segment_attention_forward_ref(T* o, const T* q, const T* k, const T* v, const std::vector<int64_t>& cu,
                                   const SegmentAttnDims& d);
// Backward of the reference (recomputes p): dq, dk, dv at stride ld_in like their inputs,
// ASSIGNED (the caller's buffer may hold other data between the heads' columns: untouched).
//   dv_j = sum_i p_ij do_i;  ds_ij = p_ij (do_i . v_j - do_i . o_i);  dq_i = scale sum_j ds_ij k_j;
//   dk_j = scale sum_i ds_ij q_i
template <typename T>
void segment_attention_backward_ref(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                    const std::vector<int64_t>& cu, const SegmentAttnDims& d);

// The gemm path (kernels/gemm.h dispatch): per segment and head S = Q K^T, row softmax,
// O = P V; the backward recomputes P and forms dV = P^T dO, dP = dO V^T, dS, dQ = dS K,
// dK = dS^T Q by gemm. Equal to the reference up to rounding (tests/kernels/test_vision_ops.cpp).
template <typename T>
void segment_attention_forward(T* o, const T* q, const T* k, const T* v, const std::vector<int64_t>& cu,
                               const SegmentAttnDims& d);
template <typename T>
void segment_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                const std::vector<int64_t>& cu, const SegmentAttnDims& d);

}  // namespace k3
