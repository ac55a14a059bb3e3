// Gated MLA mixer, NoPE (K3_REFERENCE section 4; fixture ops/mla.json). For x [T, d] (the
// layer's RMS-normed input):
//   c_q = RMSNorm(W_qa x);  q = W_qb c_q, per head [q_nope | q_rope]
//   [c_kv | k_rope] = W_kva x;  c_kv = RMSNorm(c_kv)            (cached per token)
//   W_kvb c_kv per head = [k_nope | v];  head key [k_nope | k_rope] (k_rope shared by all heads)
//   o = causal softmax attention, scale (nope + rope)^-0.5, no rotation anywhere (NoPE)
//   out = W_o (o * sigmoid(W_g x))      (the gate only if output_gate)
// The cache holds the normed c_kv (what the fixture calls kv_latent) and the raw k_rope.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace k3 {

struct MLAWeights {
  const float *q_a_proj,  // [q_lora, d]
      *q_a_norm,          // [q_lora]
      *q_b_proj,          // [H * (nope + rope), q_lora]
      *kv_a_proj,         // [kv_lora + rope, d]   kv_a_proj_with_mqa
      *kv_a_norm,         // [kv_lora]
      *kv_b_proj,         // [H * (nope + v), kv_lora]
      *o_proj,            // [d, H * v]
      *g_proj;            // [H * v, d]            (used if output_gate)
};

struct MLADims {
  int64_t d, H, q_lora, kv_lora, nope, rope, v;
  bool output_gate;
  double rms_eps;
};

// Latent cache: one row per past token (K3_REFERENCE section 4: 512 + 64 floats per token).
struct MLACache {
  std::vector<float> c_kv;    // [n, kv_lora] normed
  std::vector<float> k_rope;  // [n, rope]
  int64_t n = 0;
  void clear();  // n = 0, keeps capacity
  void reserve(int64_t tokens, const MLADims& dims);
};

// Reusable buffers (grow only).
struct MLAScratch {
  std::vector<float> cq_raw, cq, q, kva, kv, qa, olat, o, gate;
  AttentionScratch attn;
};

// Prefill / chunk: appends the T new tokens' latents to the cache and attends over the cache
// plus the new tokens (causal). K and V are re-expanded from the whole latent cache with
// W_kvb on every call. out [T, d]; x [T, d].
void mla_mixer_forward(float* out, MLACache& cache, const float* x, const MLAWeights& w, const MLADims& dims,
                       int64_t T, MLAScratch& scratch);

// Decode (T = 1 or a few tokens) with absorbed projections: W_kvb's key half is folded into
// the query (q_nope W_uk gives a kv_lora-wide query) and its value half into the output, so
// all heads attend directly over the latent cache (one shared kv head: keys [c_kv | k_rope],
// values c_kv). Equals mla_mixer_forward up to float rounding.
void mla_mixer_decode(float* out, MLACache& cache, const float* x, const MLAWeights& w, const MLADims& dims,
                      int64_t T, MLAScratch& scratch);

}  // namespace k3
