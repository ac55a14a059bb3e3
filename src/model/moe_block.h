// Stable LatentMoE block with SiTU-GLU experts (K3_REFERENCE section 5; fixture ops/moe.json).
// For x [T, d] (already RMS-normed by the layer):
//   s = sigmoid(W_r x); experts = top_k(s + b); p = renormalised unbiased s, times scale
//   z = W_down x                                   latent rows [T, l]
//   u = sum_i p_i W2_i SiTU(W1_i z, W3_i z)        routed experts in latent space
//   y = W_up RMSNorm(u) + W2s SiTU(W1s x, W3s x)   (RMSNorm only if use_norm; shared width S*F)
// latent_moe_forward runs the routed experts grouped by expert (kernels/moe.h);
// latent_moe_forward_dense_reference loops every token over its experts with plain
// matrix-vector products accumulated in double, and is the test oracle.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/moe.h"

namespace k3 {

struct LatentMoEWeights {
  const float* router;       // [E, d]   gate.weight
  const float* router_bias;  // [E]      gate.e_score_correction_bias (may be null)
  const float* down;         // [l, d]   routed_expert_down_proj
  const float* up;           // [d, l]   routed_expert_up_proj
  const float* latent_norm;  // [l]      routed_expert_norm (used if use_norm)
  const float* shared_w1;    // [S*F, d] shared_experts.gate_proj (null if shared_width == 0)
  const float* shared_w3;    // [S*F, d] shared_experts.up_proj
  const float* shared_w2;    // [d, S*F] shared_experts.down_proj
  std::vector<ExpertMatrix> w1, w3, w2;  // E each: w1, w3 [F, l]; w2 [l, F]
};

struct LatentMoEDims {
  int64_t d, l, F, E, k, shared_width;  // shared_width = num_shared_experts * F (0: none)
  bool renorm, use_norm;
  double scale, rms_eps, situ_b1, situ_b2;
};

// Routing decisions of one call, kept for balancing statistics (K3_REFERENCE section 6).
struct MoERouting {
  std::vector<int32_t> idx;   // [T, k] selected experts, best biased score first
  std::vector<float> weight;  // [T, k] mixture weights p
  std::vector<float> scores;  // [T, E] unbiased sigmoid scores s
};

// Reusable buffers (grow only).
struct MoEScratch {
  MoERouting routing;  // used when the caller passes no routing_out
  std::vector<float> z, u, un, gu, act;
  MoEExpertScratch experts;
};

// out [T, d] (assigned); x [T, d].
void latent_moe_forward(float* out, const float* x, const LatentMoEWeights& w, const LatentMoEDims& dims,
                        int64_t T, MoEScratch& scratch, MoERouting* routing_out = nullptr);
void latent_moe_forward_dense_reference(float* out, const float* x, const LatentMoEWeights& w,
                                        const LatentMoEDims& dims, int64_t T, MoEScratch& scratch,
                                        MoERouting* routing_out = nullptr);

}  // namespace k3
