// One K3 decoder layer with Block Attention Residuals (K3_REFERENCE section 2; fixtures
// ops/layer_kda.json, ops/layer_mla.json). Wiring only: the mixers, FFNs and the AttnRes read
// are computed by model/kda_mixer.h, mla_mixer.h, moe_block.h, dense_ffn.h, kernels/attn_res.h.
//
// Block state (one call, T tokens): `blocks` (completed block sums, each [T, d]) and `partial`
// (the running sum of the current block). Layer i, block size S:
//   1. x = AttnRes_attn(blocks + [partial]) if blocks is non-empty, else x = partial
//   2. if i % S == 0: append partial to blocks; the new partial starts empty
//   3. a = Mixer_i(RMSNorm_in(x));           partial = partial + a  (or a if empty)
//   4. x = AttnRes_mlp(blocks + [partial])
//   5. f = FFN_i(RMSNorm_post(x));           partial = partial + f
// AttnRes mixes per token, so the block state never crosses positions: only the mixers carry
// state across calls (LayerState). Block sums live in one [cap, T, d] buffer (no per-layer
// allocation); AttnRes reads them in place through a list of source pointers.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/kda_mixer.h"
#include "model/mla_mixer.h"
#include "model/moe_block.h"

namespace k3 {

// Every dimension the stack needs, derived once from the config.
struct ModelDims {
  int64_t d = 0, V = 0, L = 0;  // width, vocabulary, layers
  int64_t block_size = 1;       // attn_res_block_size S
  int64_t dense_I = 0;          // dense FFN width (layers < first_k_dense_replace)
  int64_t first_moe = 0;        // first_k_dense_replace
  double eps = 1e-5;            // rms_norm_eps (all norms and the AttnRes reads)
  double situ_b1 = 4, situ_b2 = 25;
  std::vector<bool> mla;        // [L] layer i is MLA (else KDA)
  KDADims kda{};
  MLADims mla_dims{};
  LatentMoEDims moe{};
  int64_t max_blocks() const { return (L + block_size - 1) / block_size; }  // completed blocks after the last layer
};
ModelDims model_dims(const K3Config& c);

// Views of one layer's parameters (nn.Linear layout [out, in]); built once per layer.
struct LayerWeights {
  const float* input_norm = nullptr;     // [d] input_layernorm
  const float* post_norm = nullptr;      // [d] post_attention_layernorm
  const float* attn_res_norm = nullptr;  // [d] self_attention_res_norm
  const float* attn_res_proj = nullptr;  // [d] self_attention_res_proj ([1, d])
  const float* mlp_res_norm = nullptr;   // [d] mlp_res_norm
  const float* mlp_res_proj = nullptr;   // [d] mlp_res_proj ([1, d])
  bool is_mla = false;
  KDAWeights kda{};                      // KDA layers
  MLAWeights mla{};                      // MLA layers
  bool is_moe = false;
  LatentMoEWeights moe{};                // MoE layers (ExpertMatrix per routed expert matrix)
  const float* dense_gate = nullptr;     // [I, d] mlp.gate_proj (dense layers)
  const float* dense_up = nullptr;       // [I, d] mlp.up_proj
  const float* dense_down = nullptr;     // [d, I] mlp.down_proj
};

// Carried per-layer decode state: the KDA recurrent + conv states, or the MLA latent cache.
struct LayerState {
  KDAState kda;
  MLACache mla;
};

// The Block AttnRes stack of one call.
struct BlockState {
  std::vector<float> blocks;   // [cap, T, d] completed block sums, the first n valid
  std::vector<float> partial;  // [T, d]
  int64_t n = 0, T = 0, d = 0, cap = 0;
  bool partial_empty = false;
  // Sizes the buffers (grow only) and empties the stack; the caller then fills `partial`.
  void begin(int64_t T, int64_t d, int64_t cap);
  float* block(int64_t i) { return blocks.data() + i * T * d; }
  const float* block(int64_t i) const { return blocks.data() + i * T * d; }
};

// Which mixer kernels run: Prefill (chunked/fast KDA core or the recurrent reference, per
// kda_path; MLA expanded over the latent cache) or Decode (KDA token-by-token recurrence:
// the decode step for one token, the recurrent reference for several; MLA absorbed).
enum class MixerMode { Prefill, Decode };

// Per-layer slots for the activations a backward pass needs. The wiring fills what it computes
// itself (AttnRes reads, norms, residual stream, routing, dense FFN); the KDA mixer fills
// `kda` through its KDASaved argument. The training engine may extend this with the MLA and
// MoE mixers' saved structs.
struct LayerRecord {
  int64_t T = 0;
  int64_t n_src_attn = 0, n_src_mlp = 0;  // AttnRes sources (blocks + partial; 1: x = partial, alpha 1)
  bool appended = false;                  // step 2 appended partial to blocks
  std::vector<float> partial_in;          // [T, d] partial at layer entry
  std::vector<float> x_attn;              // [T, d] step 1 output (mixer branch, before the norm)
  std::vector<float> alpha_attn;          // [T, n_src_attn]
  std::vector<float> h_attn;              // [T, d] RMSNorm_in(x_attn), the mixer input
  std::vector<float> rstd_attn;           // [T]
  std::vector<float> mixer_out;           // [T, d] a
  std::vector<float> partial_mid;         // [T, d] partial after step 3
  std::vector<float> x_mlp;               // [T, d] step 4 output
  std::vector<float> alpha_mlp;           // [T, n_src_mlp]
  std::vector<float> h_mlp;               // [T, d] RMSNorm_post(x_mlp), the FFN input
  std::vector<float> rstd_mlp;            // [T]
  std::vector<float> ffn_out;             // [T, d] f
  KDASaved kda;                           // KDA layers: filled by kda_mixer_forward
  MoERouting routing;                     // MoE layers: routing decisions
  std::vector<float> dense_gu, dense_act; // dense layers: [T, 2I], [T, I]
};

// Reusable buffers of the layer (grow only; steady-state calls do not allocate).
struct LayerScratch {
  std::vector<float> x, h, a, alpha, rstd, gu, act;
  std::vector<const float*> src;
  KDAScratch kda;
  MLAScratch mla;
  MoEScratch moe;
};

// Runs layer `layer` (0-based) on the block state of T tokens. st: this layer's carried state
// (KDA state reset / MLA cache cleared for a fresh sequence). rec: optional saved activations.
void decoder_layer_forward(BlockState& bs, LayerState& st, const LayerWeights& w, const ModelDims& dims,
                           int64_t layer, int64_t T, MixerMode mode, KDAPath kda_path, LayerScratch& s,
                           LayerRecord* rec = nullptr);

// An AttnRes read over blocks + [partial], token rows [row0, row0 + rows) of the stack, into
// out [rows, d] (alpha [rows, n + 1] optional); with no completed blocks, out = partial.
// Used by steps 1 and 4 and by the output read (which may read the last row only).
void block_attn_res(float* out, float* alpha, const BlockState& bs, const float* w_norm, const float* w_proj,
                    int64_t row0, int64_t rows, double eps, std::vector<const float*>& src);

}  // namespace k3
