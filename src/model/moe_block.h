// Stable LatentMoE block with SiTU-GLU experts (docs/model.md section 5; fixture ops/moe.json).
// For x [T, d] (already RMS-normed by the layer):
//   s = sigmoid(W_r x); experts = top_k(s + b); p = renormalised unbiased s, times scale
//   z = W_down x                                   latent rows [T, l]
//   u = sum_i p_i W2_i SiTU(W1_i z, W3_i z)        routed experts in latent space
//   y = W_up RMSNorm(u) + W2s SiTU(W1s x, W3s x)   (RMSNorm only if use_norm; shared width S*F)
// latent_moe_forward runs the routed experts grouped by expert (kernels/moe.h); the shared
// experts' first half (W1s x, W3s x, SiTU) runs before the routed experts and their W2s
// product after the up-projection (the same operations as one dense FFN call, so the result
// does not change), which gives an expert provider's reads that time to overlap;
// latent_moe_forward_dense_reference loops every token over its experts with plain
// matrix-vector products accumulated in double, and is the test oracle. Backward:
// model/moe_block_backward.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "kernels/weight_mat.h"

namespace k3 {

// Templates on the scalar type R: the dense reference forward and backward run in double for
// gradient checks; the grouped paths are float. LatentMoEWeights, MoEScratch, ... are the
// float instantiations.
// Matrices as held (MatT: f32, or bf16 as a checkpoint stores them; the routed experts are
// f32 or MXFP4, ExpertMatrixT); vectors f32.
template <typename R>
struct LatentMoEWeightsT {
  MatT<R> router;        // [E, d]   gate.weight
  const R* router_bias;  // [E]      gate.e_score_correction_bias (may be null; selection only)
  MatT<R> down;          // [l, d]   routed_expert_down_proj
  MatT<R> up;            // [d, l]   routed_expert_up_proj
  const R* latent_norm;  // [l]      routed_expert_norm (used if use_norm)
  MatT<R> shared_w1;     // [S*F, d] shared_experts.gate_proj (null if shared_width == 0)
  MatT<R> shared_w3;     // [S*F, d] shared_experts.up_proj
  MatT<R> shared_w2;     // [d, S*F] shared_experts.down_proj
  std::vector<ExpertMatrixT<R>> w1, w3, w2;  // E each: w1, w3 [F, l]; w2 [l, F]
  // Memory-limited inference (float only): the routed experts are not resident (w1, w3, w2
  // hold only their shapes) and come from this provider (kernels/moe.h) as MoE layer
  // provider_layer; null: resident.
  ExpertProvider* provider = nullptr;
  int64_t provider_layer = -1;
};
using LatentMoEWeights = LatentMoEWeightsT<float>;

// Parameter gradients (accumulated, +=), shaped like the weights. The router bias has none.
// experts: E entries; only experts that received tokens are touched (f32 experts only).
template <typename R>
struct LatentMoEGradsT {
  R* router;       // [E, d]
  R* down;         // [l, d]
  R* up;           // [d, l]
  R* latent_norm;  // [l]      (if use_norm)
  R* shared_w1;    // [S*F, d] (if shared_width > 0)
  R* shared_w3;    // [S*F, d]
  R* shared_w2;    // [d, S*F]
  std::vector<ExpertGradT<R>> experts;  // E: w1, w3 [F, l]; w2 [l, F]
};
using LatentMoEGrads = LatentMoEGradsT<float>;

struct LatentMoEDims {
  int64_t d, l, F, E, k, shared_width;  // shared_width = num_shared_experts * F (0: none)
  bool renorm, use_norm;
  double scale, rms_eps, situ_b1, situ_b2;
};

// Routing decisions of one call, kept for balancing statistics (docs/model.md section 6).
template <typename R>
struct MoERoutingT {
  std::vector<int32_t> idx;  // [T, k] selected experts, best biased score first
  std::vector<R> weight;     // [T, k] mixture weights p
  std::vector<R> scores;     // [T, E] unbiased sigmoid scores s
};
using MoERouting = MoERoutingT<float>;

// Activations one training forward saves for the backward (buffers grow, never shrink).
// Both forwards fill the same layout, so either backward can run on either forward's save.
template <typename R>
struct LatentMoESavedT {
  int64_t T = 0;               // tokens of the saved call
  bool keep_input = true;      // false: the caller keeps the input and hands it to the backward
  std::vector<R> x;            // [T, d]        block input (keep_input)
  MoERoutingT<R> routing;      // idx, weight [T, k]; scores [T, E]
  std::vector<R> z;            // [T, l]        W_down x
  std::vector<R> slot_gu;      // [T * k, 2F]   [W1 z | W3 z] per (token, slot) row t * k + i
  std::vector<R> slot_y;       // [T * k, l]    W2 SiTU(...) per (token, slot), before p
  std::vector<R> u;            // [T, l]        routed mixture sum_i p_i y_i
  std::vector<R> u_rstd;       // [T]           1 / rms(u) (if use_norm)
  std::vector<R> shared_gu;    // [T, 2 S*F]    shared [W1s x | W3s x] (their SiTU: recomputed)
  void ensure(int64_t T, const LatentMoEDims& dims);
};
using LatentMoESaved = LatentMoESavedT<float>;

// Reusable buffers (grow only). The d* buffers are the backward's.
template <typename R>
struct MoEScratchT {
  MoERoutingT<R> routing;  // the dense reference's, when the caller passes no routing_out
  Buf<int32_t> idx;        // [T, k] the grouped forward's routing when not saved (on the backend's device)
  Buf<R> weight;           // [T, k]
  Buf<R> scores;           // [T, E]
  Buf<R> z, u, un, gu, act;
  std::vector<int32_t> distinct;  // a provider's distinct experts of the call
  std::vector<R> dun, du, dz, dtopk_w, dlogits, dgu, dact;
  MoEExpertScratch experts;
};
using MoEScratch = MoEScratchT<float>;

// out [T, d] (assigned); x [T, d]. With `saved` (training) the activations are kept there
// (and the routing in saved->routing; routing_out, if also given, receives a copy).
// ops: the backend (kernels/ops.h); a routing_out on the host receives a copy of the routing.
// Training (saved) and an expert provider are CPU-only.
void latent_moe_forward(const Ops& ops, float* out, const float* x, const LatentMoEWeights& w,
                        const LatentMoEDims& dims, int64_t T, MoEScratch& scratch, MoERouting* routing_out = nullptr,
                        LatentMoESaved* saved = nullptr);
inline void latent_moe_forward(float* out, const float* x, const LatentMoEWeights& w, const LatentMoEDims& dims,
                               int64_t T, MoEScratch& scratch, MoERouting* routing_out = nullptr,
                               LatentMoESaved* saved = nullptr) {
  latent_moe_forward(cpu_ops<float>(), out, x, w, dims, T, scratch, routing_out, saved);
}
template <typename R>
void latent_moe_forward_dense_reference(R* out, const R* x, const LatentMoEWeightsT<R>& w,
                                        const LatentMoEDims& dims, int64_t T, MoEScratchT<R>& scratch,
                                        MoERoutingT<R>* routing_out = nullptr, LatentMoESavedT<R>* saved = nullptr);

// Backward of the forward that filled `saved` (same weights and dims; T == saved.T), for
// its routing (docs/model.md section 5: gradient through the unbiased scores of the selected
// experts and the renormalisation; the bias gets none). dx [T, d] assigned; grads
// accumulated (+=); dout [T, d]. dscores_aux [T, E] (optional): an extra gradient of the
// sigmoid scores, e.g. router_aux_loss's (kernels/router.h), added in the router backward.
//   y = W_up un + shared(x), un = RMSNorm(u) * w_n, u = sum_i p_i E_i(z), z = W_down x
// Grouped (float): projections are gemms, experts go through moe_experts_backward.
// x: the forward's input [T, d] when saved.keep_input was false (else null: saved.x).
void latent_moe_backward(float* dx, const LatentMoEGrads& grads, const float* dout, const LatentMoESaved& saved,
                         const LatentMoEWeights& w, const LatentMoEDims& dims, int64_t T, MoEScratch& scratch,
                         const float* dscores_aux = nullptr, const float* x = nullptr);
// Dense reference: per token, plain loops (accumulated in double) for the latent path, the
// experts (moe_experts_backward_reference) and the shared experts; the router through
// router_backward. The gradient-check oracle.
template <typename R>
void latent_moe_backward_dense_reference(R* dx, const LatentMoEGradsT<R>& grads, const R* dout,
                                         const LatentMoESavedT<R>& saved, const LatentMoEWeightsT<R>& w,
                                         const LatentMoEDims& dims, int64_t T, MoEScratchT<R>& scratch,
                                         const R* dscores_aux = nullptr, const R* x = nullptr);

}  // namespace k3
