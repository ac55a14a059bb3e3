// One K3 decoder layer with Block Attention Residuals (docs/model.md section 2; fixtures
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
//
// Everything is a template on the scalar type R: float for inference and training, double for
// the whole-model gradient checks (one wiring, two instantiations). In double the MoE block
// runs its dense reference (the grouped path is float-only), the KDA Fast path is the chunked
// reference, and MLA Decode mode is unavailable (the absorbed decode is float-only).
// LayerWeights, LayerRecord, ... are the float instantiations.
//
// Backward (decoder_backward.cpp): decoder_layer_backward reverses the five steps from a
// LayerRecordT filled by a training forward (full sequence, fresh state, empty MLA cache).
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
template <typename R>
struct LayerWeightsT {
  const R* input_norm = nullptr;     // [d] input_layernorm
  const R* post_norm = nullptr;      // [d] post_attention_layernorm
  const R* attn_res_norm = nullptr;  // [d] self_attention_res_norm
  const R* attn_res_proj = nullptr;  // [d] self_attention_res_proj ([1, d])
  const R* mlp_res_norm = nullptr;   // [d] mlp_res_norm
  const R* mlp_res_proj = nullptr;   // [d] mlp_res_proj ([1, d])
  bool is_mla = false;
  KDAWeightsT<R> kda{};              // KDA layers
  MLAWeightsT<R> mla{};              // MLA layers
  bool is_moe = false;
  LatentMoEWeightsT<R> moe{};        // MoE layers (ExpertMatrix per routed expert matrix)
  MatT<R> dense_gate;                // [I, d] mlp.gate_proj (dense layers; f32 or bf16 as held)
  MatT<R> dense_up;                  // [I, d] mlp.up_proj
  MatT<R> dense_down;                // [d, I] mlp.down_proj
};
using LayerWeights = LayerWeightsT<float>;

// Gradient views of one layer, field for field the shapes of LayerWeightsT (accumulated, +=).
// The router bias has none. Built by rebase_grads from the layer's weight views.
template <typename R>
struct LayerGradsT {
  R* input_norm = nullptr;     // [d]
  R* post_norm = nullptr;      // [d]
  R* attn_res_norm = nullptr;  // [d]
  R* attn_res_proj = nullptr;  // [d]
  R* mlp_res_norm = nullptr;   // [d]
  R* mlp_res_proj = nullptr;   // [d]
  KDAGradsT<R> kda{};          // KDA layers
  MLAGradsT<R> mla{};          // MLA layers
  LatentMoEGradsT<R> moe{};    // MoE layers (experts: E entries)
  R* dense_gate = nullptr;     // [I, d]
  R* dense_up = nullptr;       // [I, d]
  R* dense_down = nullptr;     // [d, I]
};
using LayerGrads = LayerGradsT<float>;

// The gradient views of a buffer `to` carved exactly like the weight buffer `from` that `w`
// views (same ParamLayout, Plain experts): every pointer p of w becomes to + (p - from).
// Fills g in place (its expert vector keeps its capacity: no allocation in steady state).
template <typename R>
void rebase_grads(LayerGradsT<R>& g, const LayerWeightsT<R>& w, const R* from, R* to);

// Carried per-layer decode state: the KDA recurrent + conv states, or the MLA latent cache.
template <typename R>
struct LayerStateT {
  KDAStateT<R> kda;
  MLACacheT<R> mla;
  KDAStepLog kda_log;  // KDA layers, when enabled: per-token states of a Decode call (float)
};
using LayerState = LayerStateT<float>;

// The Block AttnRes stack of one call.
template <typename R>
struct BlockStateT {
  Buf<R> blocks;   // [cap, T, d] completed block sums, the first n valid (on the backend's device)
  Buf<R> partial;  // [T, d]
  int64_t n = 0, T = 0, d = 0, cap = 0;
  bool partial_empty = false;
  // Sizes the buffers on `dev` (grow only) and empties the stack; the caller then fills `partial`.
  void begin(int64_t T, int64_t d, int64_t cap, Device* dev = nullptr);
  R* block(int64_t i) { return blocks.data() + i * T * d; }
  const R* block(int64_t i) const { return blocks.data() + i * T * d; }
};
using BlockState = BlockStateT<float>;

// Which mixer kernels run: Prefill (chunked/fast KDA core or the recurrent reference, per
// kda_path; MLA expanded over the latent cache) or Decode (KDA token by token: the decode
// step, its fast variant for kda_path Fast, else the recurrent reference; MLA absorbed).
// PrefillLatent: Prefill's KDA, with MLA attending over the latent cache with absorbed
// projections (as in decode) instead of re-expanding K and V for every cached token on every
// call, so a long chunked prefill holds only the latent cache (576 values per token and MLA
// layer for K3) and its cost per chunk does not grow with the expansion of the whole prefix.
enum class MixerMode { Prefill, Decode, PrefillLatent };

// Per-layer saved activations of a training forward (filled when a record is passed: full
// sequence, fresh state, empty MLA cache): one buffer per role, and only what the backward
// cannot recompute at elementwise cost (docs/architecture.md "Training memory"). The AttnRes
// reads' outputs x (their saved weights alpha over the sources), the norms' outputs h (the
// saved 1/rms), the mixer and FFN outputs (never read) and the dense FFN's SiTU output are
// recomputed by the backward with the forward's own kernels, bit for bit. The mixers and the
// MoE block keep their own saved structs, without their input (the layer recomputes it).
// Buffers grow only (steady-state training does not allocate).
template <typename R>
struct LayerRecordT {
  int64_t T = 0;
  int64_t n_src_attn = 0, n_src_mlp = 0;  // AttnRes sources (blocks + partial; 1: x = partial, alpha 1)
  bool appended = false;                  // step 2 appended partial to blocks
  std::vector<R> partial_in;              // [T, d] partial at layer entry
  std::vector<R> alpha_attn;              // [T, n_src_attn] step 1's weights
  std::vector<R> rstd_attn;               // [T]
  std::vector<R> partial_mid;             // [T, d] partial after step 3
  std::vector<R> alpha_mlp;               // [T, n_src_mlp] step 4's weights
  std::vector<R> rstd_mlp;                // [T]
  KDASavedT<R> kda;                       // KDA layers: filled by kda_mixer_forward
  MLASavedT<R> mla;                       // MLA layers: filled by mla_mixer_forward
  LatentMoESavedT<R> moe;                 // MoE layers: filled by the MoE forward (routing in moe.routing)
  std::vector<R> dense_gu;                // dense layers: [T, 2I]
};
using LayerRecord = LayerRecordT<float>;

// Reusable buffers of the layer (grow only; steady-state calls do not allocate). The d*
// buffers are the backward's.
template <typename R>
struct LayerScratchT {
  Buf<R> x, h, a, alpha, rstd, gu, act;  // forward (on the backend's device)
  std::vector<const R*> src;
  std::vector<R> dx, dh, dgu, dact;  // backward: [T, d], [T, d], [T, 2I], [T, I]
  std::vector<R*> dsrc;
  KDAScratchT<R> kda;
  MLAScratchT<R> mla;
  MoEScratchT<R> moe;
  std::vector<KDAStateT<R>*> seg_kda;  // batched calls: each sequence's state of this layer
  std::vector<MLACacheT<R>*> seg_mla;
};
using LayerScratch = LayerScratchT<float>;

// Several sequences in one Decode call (batched decode, float only): sequence j holds rows
// [seg[j], seg[j+1]) of the block state (seg[0] = 0, seg[n] = T) and carries *states[j] for
// this layer. Everything but the mixers' state is per token, so the rows of all sequences run
// together: each weight, and each routed expert chosen by any row, is read once per call.
template <typename R>
struct LayerBatchT {
  const int64_t* seg = nullptr;
  int64_t n = 0;
  LayerStateT<R>* const* states = nullptr;
};
using LayerBatch = LayerBatchT<float>;

// Runs layer `layer` (0-based) on the block state of T tokens. st: this layer's carried state
// (KDA state reset / MLA cache cleared for a fresh sequence). rec: optional saved activations
// (training: Prefill mode, fresh state). batch: several sequences (Decode mode; st unused).
// ops: the backend (kernels/ops.h); bs, st and s on its device. A record is CPU-only.
template <typename R>
void decoder_layer_forward(const OpsT<R>& ops, BlockStateT<R>& bs, LayerStateT<R>& st, const LayerWeightsT<R>& w,
                           const ModelDims& dims, int64_t layer, int64_t T, MixerMode mode, KDAPath kda_path,
                           LayerScratchT<R>& s, LayerRecordT<R>* rec = nullptr, const LayerBatchT<R>* batch = nullptr);
template <typename R>
void decoder_layer_forward(BlockStateT<R>& bs, LayerStateT<R>& st, const LayerWeightsT<R>& w, const ModelDims& dims,
                           int64_t layer, int64_t T, MixerMode mode, KDAPath kda_path, LayerScratchT<R>& s,
                           LayerRecordT<R>* rec = nullptr, const LayerBatchT<R>* batch = nullptr) {
  decoder_layer_forward<R>(cpu_ops<R>(), bs, st, w, dims, layer, T, mode, kda_path, s, rec, batch);
}

// Gradient of the block state, mirroring BlockStateT: dblocks[i] is the loss gradient w.r.t.
// completed block i, dpartial w.r.t. the partial sum (both [T, d]). The backward of layer i
// turns the gradient of the state after the layer into that of the state before it.
template <typename R>
struct BlockGradT {
  std::vector<R> dblocks;   // [cap, T, d], the first n valid
  std::vector<R> dpartial;  // [T, d]
  int64_t n = 0, T = 0, d = 0, cap = 0;
  // Sizes the buffers (grow only) for n completed blocks and zero-fills all gradients.
  void begin(int64_t T, int64_t d, int64_t cap, int64_t n);
  R* dblock(int64_t i) { return dblocks.data() + i * T * d; }
  const R* dblock(int64_t i) const { return dblocks.data() + i * T * d; }
};
using BlockGrad = BlockGradT<float>;

// Backward of decoder_layer_forward for the call that filled `rec` (same weights, dims and
// layer): on entry bg holds the gradient of the block state after the layer, on return that
// of the state before it (n decreases by one where the layer appended a block). Parameter
// gradients accumulate (+=) into g. dscores_aux [T, E] (MoE layers, optional): an extra
// gradient of the router's sigmoid scores (the auxiliary balance loss).
//   5. partial'' = partial' + f:  d partial' = d partial'';  d f = d partial''
//   4. x2 = AttnRes_mlp(blocks' + [partial']): sources accumulate (attn_res_backward)
//   3. partial' = partial + a (or a): d a = d partial'; appended: d partial = d blocks[n]
//   1. x1 = AttnRes_attn(blocks + [partial]) (or partial): sources accumulate
// blocks: the forward's completed block sums [>= n, T, d] (ForwardRecordT::blocks; blocks never
// change once appended, so the final stack holds every layer's sources).
template <typename R>
void decoder_layer_backward(BlockGradT<R>& bg, const LayerRecordT<R>& rec, const R* blocks, const LayerWeightsT<R>& w,
                            const LayerGradsT<R>& g, const ModelDims& dims, int64_t layer, LayerScratchT<R>& s,
                            const R* dscores_aux = nullptr);

// An AttnRes read over blocks + [partial], token rows [row0, row0 + rows) of the stack, into
// out [rows, d] (alpha [rows, n + 1] optional); with no completed blocks, out = partial.
// Used by steps 1 and 4 and by the output read (which may read the last row only).
template <typename R>
void block_attn_res(const OpsT<R>& ops, R* out, R* alpha, const BlockStateT<R>& bs, const R* w_norm, const R* w_proj,
                    int64_t row0, int64_t rows, double eps, std::vector<const R*>& src);

}  // namespace k3
