// The K3 stack (K3_REFERENCE section 2): token embedding, the decoder layers with Block
// Attention Residuals (model/decoder.h), the output AttnRes read (final_res_norm /
// final_res_proj), the final RMSNorm and lm_head. One wiring serves a full forward (fresh
// DecodeState), a prefill (chunked/fast KDA core, expanded MLA) and decode steps (KDA decode
// step, absorbed MLA over the latent cache): the DecodeState carries each layer's mixer state
// between calls, so prefill + decode steps equal one forward over all tokens.
// The model owns its WeightStore and builds each layer's weight views once.
#pragma once
#include <cstdint>
#include <vector>

#include "model/decoder.h"
#include "model/weights.h"

namespace k3 {

// Decode state of one sequence: per layer the KDA recurrent + conv states or the MLA latent
// cache (c_kv and k_rope per token), and the number of tokens consumed.
struct DecodeState {
  std::vector<LayerState> layers;  // [L]
  int64_t n_tokens = 0;
  void reset(const ModelDims& dims);                    // fresh sequence: zero states, empty caches
  void reserve(int64_t tokens, const ModelDims& dims);  // pre-size the MLA caches
};

struct ForwardOptions {
  MixerMode mode = MixerMode::Prefill;
  KDAPath kda_path = KDAPath::Fast;  // multi-token KDA core in Prefill mode (Decode: see decoder.h)
  bool last_only = false;            // logits [1, V] of the last position only (generation)
};

// Saved activations of one forward call, for a backward pass (filled only when passed). With
// last_only the output-read fields cover the last row only.
struct ForwardRecord {
  int64_t T = 0;
  std::vector<LayerRecord> layers;  // [L]
  int64_t n_blocks = 0;             // completed blocks after the last layer
  std::vector<float> blocks;        // [n_blocks, T, d]
  std::vector<float> partial;       // [T, d] final partial sum
  std::vector<float> alpha_out;     // [rows, n_blocks + 1] output AttnRes weights
  std::vector<float> h_out;         // [rows, d] AttnRes_out(blocks + [partial])
  std::vector<float> rstd_final;    // [rows]
  std::vector<float> h_final;       // [rows, d] final RMSNorm output, the lm_head input
};

// Reusable buffers of a forward call (grow only).
struct ForwardScratch {
  BlockState bs;
  LayerScratch layer;
  std::vector<float> h_out, h_final, rstd;
  std::vector<const float*> src;
};

// Views of layer `layer`'s parameters in the store (routed experts f32 or MXFP4 per the store).
LayerWeights layer_weights(const WeightStore& w, int64_t layer);
// The same views over any buffer carved by a Plain `lay` (e.g. the gradient buffer or an
// optimizer moment that mirrors the store): pointer = base + lay.offset(spec).
LayerWeights layer_views(const ParamLayout& lay, const K3Config& c, const float* base, int64_t layer);

class K3Model {
 public:
  explicit K3Model(WeightStore weights);
  K3Model(K3Model&&) = default;  // views stay valid: they point into heap memory the store owns
  K3Model(const K3Model&) = delete;
  K3Model& operator=(const K3Model&) = delete;

  const K3Config& config() const { return store_.config(); }
  const ModelDims& dims() const { return dims_; }
  const WeightStore& weights() const { return store_; }
  WeightStore& weights() { return store_; }  // in-place updates keep the views valid
  const LayerWeights& layer(int64_t i) const { return layers_.at(size_t(i)); }
  DecodeState new_state() const;  // reset for this model

  // logits [T, V] (or [1, V] with last_only) for ids [T], continuing the sequence in `st`
  // (st.n_tokens += T). Token ids outside [0, V) are a k3::Error naming the position.
  void forward(float* logits, const int32_t* ids, int64_t T, DecodeState& st, ForwardScratch& s,
               const ForwardOptions& opt = {}, ForwardRecord* rec = nullptr) const;

 private:
  WeightStore store_;
  ModelDims dims_;
  std::vector<LayerWeights> layers_;
  const float* embed_ = nullptr;           // [V, d]
  const float* final_res_norm_ = nullptr;  // [d]
  const float* final_res_proj_ = nullptr;  // [d]
  const float* final_norm_ = nullptr;      // [d]
  const float* lm_head_ = nullptr;         // [V, d] (the embedding when tied)
};

}  // namespace k3
