// The K3 stack (docs/model.md section 2): token embedding, the decoder layers with Block
// Attention Residuals (model/decoder.h), the output AttnRes read (output_attn_res_norm /
// output_attn_res_proj), the final RMSNorm and lm_head. One wiring serves a full forward (fresh
// DecodeState), a prefill (chunked/fast KDA core, expanded MLA) and decode steps (KDA decode
// step, absorbed MLA over the latent cache): the DecodeState carries each layer's mixer state
// between calls, so prefill + decode steps equal one forward over all tokens.
// The model owns its WeightStore and builds each layer's weight views once.
//
// K3ModelT<R> is a template on the scalar type: K3Model = K3ModelT<float> is the engine;
// K3ModelT<double> holds a double copy of the same WeightStore values (Plain experts only)
// and runs the same wiring in double (decoder.h) for gradient checks. The backward
// (k3_model_backward.cpp) takes the ForwardRecordT of a training forward and the gradient
// of the logits and accumulates every parameter's gradient into a buffer carved like the
// weights.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/decoder.h"
#include "model/head_provider.h"
#include "model/trunk_provider.h"
#include "model/weights.h"

namespace k3 {

// Decode state of one sequence: per layer the KDA recurrent + conv states or the MLA latent
// cache (c_kv and k_rope per token), and the number of tokens consumed.
template <typename R>
struct DecodeStateT {
  std::vector<LayerStateT<R>> layers;  // [L]
  int64_t n_tokens = 0;
  void reset(const ModelDims& dims, Device* dev = nullptr);  // fresh sequence on dev: zero states, empty caches
  void move_to(Device* dev);                                // keeps the contents
  void reserve(int64_t tokens, const ModelDims& dims);  // pre-size the MLA caches
};
using DecodeState = DecodeStateT<float>;

struct ForwardOptions {
  MixerMode mode = MixerMode::Prefill;
  KDAPath kda_path = KDAPath::Fast;  // multi-token KDA core in Prefill mode (Decode: see decoder.h)
  bool last_only = false;            // logits [1, V] of the last position only (generation)
};

// Saved activations of one forward call, for a backward pass (filled only when passed). With
// last_only the output-read fields cover the last row only (no backward then).
template <typename R>
struct ForwardRecordT {
  int64_t T = 0;
  bool last_only = false;
  std::vector<LayerRecordT<R>> layers;  // [L]
  int64_t n_blocks = 0;                 // completed blocks after the last layer
  std::vector<R> blocks;                // [>= n_blocks, T, d]: the first n_blocks are the stack
  std::vector<R> partial;               // [T, d] final partial sum
  std::vector<R> alpha_out;             // [rows, n_blocks + 1] output AttnRes weights
  std::vector<R> h_out;                 // [rows, d] AttnRes_out(blocks + [partial])
  std::vector<R> rstd_final;            // [rows]
  std::vector<R> h_final;               // [rows, d] final RMSNorm output, the lm_head input
};
using ForwardRecord = ForwardRecordT<float>;

// Rows that replace the token embeddings at the positions holding `media_id` (the expanded
// <|media_pad|> placeholders, docs/model.md section 11), in order: the vision encoder's image
// tokens enter the text stream here. The backward writes their gradient to drows (assigned)
// and gives the embedding row of media_id nothing for those positions. A count of media_id
// positions different from n is a k3::Error.
template <typename R>
struct EmbedSpliceT {
  int32_t media_id = -1;
  const R* rows = nullptr;  // [n, d]
  int64_t n = 0;
  R* drows = nullptr;       // [n, d] (backward)
};

// Reusable buffers of a forward call (grow only).
template <typename R>
struct ForwardScratchT {
  BlockStateT<R> bs;
  LayerScratchT<R> layer;
  Buf<R> h_out, h_final, rstd, alpha;  // on the model's device
  Buf<int32_t> ids;                    // a device model's token ids
  Buf<R> logits;                       // a device model's logits before they are copied out
  std::vector<const R*> src;
  std::vector<LayerStateT<R>*> seg_states;  // forward_batch: each sequence's state of one layer
};
using ForwardScratch = ForwardScratchT<float>;

// Reusable buffers of a backward call (grow only): the block-state gradient, the output
// chain's gradients and the per-layer gradient views.
template <typename R>
struct BackwardScratchT {
  BlockGradT<R> bg;
  std::vector<R> dh_final, dh_out;  // [T, d]
  std::vector<LayerGradsT<R>> grads;  // [L] views of the gradient buffer (rebased every call)
  std::vector<const R*> src;
  std::vector<R*> dsrc;
};
using BackwardScratch = BackwardScratchT<float>;

// Views of layer `layer`'s parameters in the store (routed experts f32 or MXFP4 per the store).
LayerWeights layer_weights(const WeightStore& w, int64_t layer);
// Layer `layer`'s views with every dense parameter from P(name) (vector fields take its f32
// pointer) and the routed experts shape-only (an ExpertProvider serves them): a trunk ring's
// views of a slot (infer/trunk_ring.h).
LayerWeights bind_layer_weights(const K3Config& c, int64_t layer, const std::function<Mat(const std::string&)>& P);
// The same views over any buffer carved by a Plain `lay` (e.g. the gradient buffer, an
// optimizer moment, or a double copy of the weights): pointer = base + lay.offset(spec).
template <typename R>
LayerWeightsT<R> layer_views(const ParamLayout& lay, const K3Config& c, const R* base, int64_t layer);

// Told by a backward, as it goes, each range [lo, hi) of the gradient buffer (element offsets)
// that this call has finished adding into: nothing in it changes again before the call
// returns. One call reports the sections of ParamLayout::layer_sections in the backward's
// order: the output head's, the layers' from the last to the first, the embedding's last, so
// the ranges are disjoint and cover the whole buffer. Data parallelism starts the gradient
// reduction of a range here (train/trainer_forward.cpp). Called on the backward's own thread.
using GradRangeDone = std::function<void(int64_t lo, int64_t hi)>;

// Rows of the lm_head per logits block: about 32 MB of bf16 rows, a multiple of the bf16
// product's panel (kernels/gemm.h bf16_panel_rows, so a held bf16 lm_head makes the same
// sgemm calls as unblocked), at most V (a small model: one block, the unblocked product).
int64_t lm_head_block_rows(const K3Config& c);

template <typename R>
class K3ModelT {
 public:
  // float: takes the store (its buffer is what the views point into). double: the store's
  // values are copied into a double buffer with the same layout (Plain experts required).
  explicit K3ModelT(WeightStore weights);
  K3ModelT(K3ModelT&&) = default;  // views stay valid: they point into heap memory the model owns
  K3ModelT(const K3ModelT&) = delete;
  K3ModelT& operator=(const K3ModelT&) = delete;

  // The backend the forward passes run on (kernels/ops.h; docs/architecture.md "Backends"):
  // the CPU unless to_backend() moved the model. A device backend (float only) holds a copy of
  // every weight in its memory; the decode states and the scratch live there too (they move
  // on first use), and forward() / forward_batch() take token ids from the host and give the
  // logits back to the host, nothing else. Weights streamed from disk, expert providers and
  // training stay on the CPU (a k3::Error says so). The CPU store stays as it is.
  void to_backend(std::shared_ptr<const OpsT<R>> ops);
  const OpsT<R>& ops() const { return *ops_; }
  Device* device() const { return ops_->device(); }
  // Bytes of device memory a to_backend() copy of this model's weights takes.
  int64_t device_weight_bytes() const;

  const K3Config& config() const { return store_.config(); }
  const ModelDims& dims() const { return dims_; }
  // Inference only: MLA log-length attention scaling with base n (MLADims::logn_base; 0 off,
  // the K3 forward). The training forward refuses a model with it on.
  void set_mla_logn_base(int64_t n) { dims_.mla_dims.logn_base = n; }
  // The f32 store. For float the forward reads it (in-place updates keep the views valid);
  // for double it is only the source of the values, the layout and the config.
  const WeightStore& weights() const { return store_; }
  WeightStore& weights() { return store_; }
  // The buffer the layer views point into ([weights().size()], carved by weights().layout()):
  // float the store's own buffer, double its copy. Writing into it changes the model.
  const R* params() const { return params_; }
  R* params() { return params_; }
  const LayerWeightsT<R>& layer(int64_t i) const { return layers_.at(size_t(i)); }
  DecodeStateT<R> new_state() const;  // reset for this model, on its device

  // Memory-limited inference (float only): every MoE layer takes its routed experts from p
  // (kernels/moe.h ExpertProvider; infer/weight_stream.h) instead of the store; null: the
  // store's (resident). The model keeps p alive. Forwards through one provider serialise on it.
  void set_expert_provider(std::shared_ptr<ExpertProvider> p);
  ExpertProvider* expert_provider() const { return provider_.get(); }
  // Memory-limited inference with the trunk streamed (float only; a store loaded with
  // LoadOptions::stream_trunk needs one): every forward and forward_batch takes each decoder
  // layer's views from p (model/trunk_provider.h), reading the next layer while one computes.
  void set_trunk_provider(std::shared_ptr<TrunkProvider> p);
  TrunkProvider* trunk_provider() const { return trunk_.get(); }
  // Memory-limited inference with the embedding and lm_head streamed (float only; a store
  // loaded with LoadOptions::stream_head needs one): embedding rows and lm_head blocks come
  // from p (model/head_provider.h); p->block_rows() must equal head_block_rows().
  void set_head_provider(std::shared_ptr<HeadProvider> p);
  HeadProvider* head_provider() const { return head_.get(); }
  // The logits are computed in blocks of this many lm_head rows, held or streamed alike (the
  // same products, so a streamed lm_head gives the resident logits bit for bit: OpenBLAS
  // sgemm's rounding depends on N, so the blocking must not). Default: lm_head_block_rows.
  int64_t head_block_rows() const { return head_block_rows_; }
  void set_head_block_rows(int64_t rows);  // tests: several blocks on a small model

  // logits [T, V] (or [1, V] with last_only) for ids [T], continuing the sequence in `st`
  // (st.n_tokens += T). Token ids outside [0, V) are a k3::Error naming the position.
  // With rec (training): Prefill mode, a fresh state and every position's logits.
  void forward(R* logits, const int32_t* ids, int64_t T, DecodeStateT<R>& st, ForwardScratchT<R>& s,
               const ForwardOptions& opt = {}, ForwardRecordT<R>* rec = nullptr,
               const EmbedSpliceT<R>* splice = nullptr) const;

  // Batched decode (float only): n_seg sequences in one call, sequence j appending ids rows
  // [seg[j], seg[j+1]) (seg[0] = 0, T = seg[n_seg]) to *states[j]. logits [T, V], every row.
  // Every weight, and every routed expert any row picks, is read once for the batch; each
  // sequence's logits equal its own forward in Decode mode up to float rounding.
  void forward_batch(R* logits, const int32_t* ids, const int64_t* seg, int64_t n_seg, DecodeStateT<R>* const* states,
                     ForwardScratchT<R>& s, KDAPath kda_path = KDAPath::Fast) const;
  // The same with the logits [T, V] left on the model's backend, in s.logits (device memory for
  // a device backend), returned: a decode step of greedy sequences then reads one id per
  // sequence (OpsT::argmax_rows) instead of a row of logits, and the rows it needs it reads out
  // one by one (Buf::read).
  const R* forward_batch_device(const int32_t* ids, const int64_t* seg, int64_t n_seg,
                                DecodeStateT<R>* const* states, ForwardScratchT<R>& s,
                                KDAPath kda_path = KDAPath::Fast) const;

  // Backward of the forward that filled `rec` (with ids [T]): dlogits [T, V] is the gradient
  // of the loss w.r.t. the logits; every parameter gradient is accumulated (+=) into `grads`
  // (a buffer of weights().size() values carved by weights().layout(); Plain experts). The
  // router bias gets none. dscores_aux (optional): per layer [L] a [T, E] extra gradient of
  // the MoE router's sigmoid scores (null entries for none). done (optional): told each
  // section of grads once it is final (GradRangeDone above). Thread-safe for distinct
  // scratch, record and grads on one const model.
  void backward(R* grads, const R* dlogits, const int32_t* ids, const ForwardRecordT<R>& rec,
                BackwardScratchT<R>& s, LayerScratchT<R>& ls, const R* const* dscores_aux = nullptr,
                const EmbedSpliceT<R>* splice = nullptr, const GradRangeDone* done = nullptr) const;

 private:
  WeightStore store_;
  std::vector<R> copy_;  // double: the converted weights (float: empty)
  R* params_ = nullptr;
  ModelDims dims_;
  std::vector<LayerWeightsT<R>> layers_;
  MatT<R> embed_;                      // [V, d] as held (f32, or bf16 for inference)
  const R* final_res_norm_ = nullptr;  // [d]
  const R* final_res_proj_ = nullptr;  // [d]
  const R* final_norm_ = nullptr;      // [d]
  MatT<R> lm_head_;                    // [V, d] (the embedding when tied)
  std::shared_ptr<ExpertProvider> provider_;  // memory-limited inference (float only)
  std::shared_ptr<TrunkProvider> trunk_;      // the trunk streamed (float only)
  std::shared_ptr<HeadProvider> head_;        // the embedding and lm_head streamed (float only)
  bool trunk_streamed_ = false;               // the store holds no layer matrices (needs trunk_)
  bool head_streamed_ = false;                // the store holds no embedding / lm_head (needs head_)
  int64_t head_block_rows_ = 0;
  std::vector<int64_t> sections_;  // ParamLayout::layer_sections (the backward's progress reports)
  std::shared_ptr<const OpsT<R>> ops_;  // the backend (the CPU's by default)
  struct OutputViews {
    const R* res_norm;  // [d] output_attn_res_norm
    const R* res_proj;  // [d] output_attn_res_proj
    const R* norm;      // [d] the final norm
  };
  // A device backend's copy of the weights and the views into it (k3_model_device.cpp).
  struct DeviceWeights {
    Buf<R> params;                                     // the f32 store's buffer
    std::vector<std::shared_ptr<Buf<uint16_t>>> bf16;  // by table position: bf16-held matrices
    std::vector<Mxfp4Matrix> mx;                       // by table position: MXFP4 experts (device views)
    std::vector<LayerWeightsT<R>> layers;
    MatT<R> embed, lm_head;
    OutputViews out{};
  };
  std::unique_ptr<DeviceWeights> dev_;
  OutputViews output_views() const;  // on the backend's device
  MatT<R> dev_embed() const;
  MatT<R> dev_lm_head() const;
  const LayerWeightsT<R>& dev_layer(int64_t i) const;
  // ids_host: [T] token ids on the host; ids_dev: the same on the backend's device.
  void embed(R* dst, const int32_t* ids_host, const int32_t* ids_dev, int64_t T) const;
  void lm_head(R* logits, const R* h, int64_t rows) const;  // logits [rows, V] = h lm_head^T, by blocks (device)
  // The token ids on the device (a copy in s.ids for a device backend) after checking them.
  const int32_t* stage_ids(const int32_t* ids, int64_t T, ForwardScratchT<R>& s) const;
  // logits [rows, V] on the device: the caller's (CPU) or s.logits, copied out by finish_logits.
  R* device_logits(R* logits, int64_t rows, ForwardScratchT<R>& s) const;
  void finish_logits(R* logits, int64_t rows, ForwardScratchT<R>& s) const;
  // forward_batch (logits given, on the host) and forward_batch_device (null: s.logits).
  const R* forward_batch_impl(R* logits, const int32_t* ids, const int64_t* seg, int64_t n_seg,
                              DecodeStateT<R>* const* states, ForwardScratchT<R>& s, KDAPath kda_path) const;
  // The views of layer i for this call: the model's own, or the trunk provider's (acquired,
  // with the next layer's read started).
  const LayerWeightsT<R>& layer_for_call(int64_t i) const;
};
using K3Model = K3ModelT<float>;

}  // namespace k3
