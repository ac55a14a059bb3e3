// The K3 stack (see k3_model.h; docs/model.md section 2).
#include "model/k3_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "model/bind_layer.h"

namespace k3 {

LayerWeights layer_weights(const WeightStore& w, int64_t layer) {
  const ParamLayout& lay = w.layout();
  // Every parameter as held (f32, or bf16 for a matrix kept as stored): vector fields take the
  // f32 pointer, matrix fields the Mat.
  auto P = [&](const std::string& name) { return w.mat(name); };
  auto X = [&](auto&& name_fn, int) {
    const std::string name = name_fn();
    const size_t i = lay.index(name);
    ExpertMatrix m;
    m.rows = lay.spec(i).shape[0];
    m.cols = lay.spec(i).shape[1];
    if (lay.in_buffer(i)) {
      m.f32 = w.param(i);
    } else {
      if (!w.experts_external()) {
        K3_ASSERT(w.has_mxfp4(i), "MXFP4 routed expert not loaded: " + name);
        m.mx = &w.mxfp4(i);
      }  // else: shape only; the model's ExpertProvider supplies the matrix
    }
    return m;
  };
  return bind_layer<float>(w.config(), layer, P, X);
}

LayerWeights bind_layer_weights(const K3Config& c, int64_t layer, const std::function<Mat(const std::string&)>& P) {
  const int64_t F = c.moe_intermediate_size, l = c.routed_expert_hidden_size;
  auto X = [&](auto&&, int which) { return which < 2 ? ExpertMatrix{nullptr, nullptr, F, l} : ExpertMatrix{nullptr, nullptr, l, F}; };
  return bind_layer<float>(c, layer, P, X);
}

template <typename R>
LayerWeightsT<R> layer_views(const ParamLayout& lay, const K3Config& c, const R* base, int64_t layer) {
  K3_ASSERT(lay.experts() == ExpertStorage::Plain, "layer_views needs a layout with every parameter in the buffer");
  auto P = [&](const std::string& name) { return base + lay.offset(lay.index(name)); };
  auto X = [&](auto&& name_fn, int) {
    const size_t i = lay.index(name_fn());
    return ExpertMatrixT<R>{base + lay.offset(i), nullptr, lay.spec(i).shape[0], lay.spec(i).shape[1]};
  };
  return bind_layer<R>(c, layer, P, X);
}

template <typename R>
void DecodeStateT<R>::reset(const ModelDims& dims, Device* dev) {
  layers.resize(size_t(dims.L));
  for (int64_t i = 0; i < dims.L; ++i) {
    LayerStateT<R>& l = layers[size_t(i)];
    if (dims.mla[size_t(i)]) l.mla.clear(dev);
    else l.kda.reset(dims.kda, dev);
    l.kda.move_to(dev);  // the other kind's (empty) buffers too: a whole state on one device
    l.mla.move_to(dev);
  }
  n_tokens = 0;
}

template <typename R>
void DecodeStateT<R>::move_to(Device* dev) {
  for (LayerStateT<R>& l : layers) {
    l.kda.move_to(dev);
    l.mla.move_to(dev);
  }
}

template <typename R>
void DecodeStateT<R>::reserve(int64_t tokens, const ModelDims& dims) {
  for (int64_t i = 0; i < dims.L && i < int64_t(layers.size()); ++i)
    if (dims.mla[size_t(i)]) layers[size_t(i)].mla.reserve(tokens, dims.mla_dims);
}

template <typename R>
K3ModelT<R>::K3ModelT(WeightStore weights)
    : store_(std::move(weights)),
      dims_(model_dims(store_.config())),
      ops_(std::shared_ptr<const OpsT<R>>(&cpu_ops<R>(), [](const OpsT<R>*) {})) {
  for (size_t i = 0; i < store_.layout().size(); ++i)
    if (store_.layout().streamed(i)) {
      if (is_streamable_head_matrix(store_.layout().spec(i))) head_streamed_ = true;
      else trunk_streamed_ = true;
    }
  K3_ASSERT((std::is_same_v<R, float> || !store_.layout().any_streamed()), "K3ModelT<double> needs every weight held");
  head_block_rows_ = lm_head_block_rows(store_.config());
  sections_ = store_.layout().layer_sections(dims_.L);
  if constexpr (std::is_same_v<R, float>) {
    params_ = store_.data();
    layers_.reserve(size_t(dims_.L));
    for (int64_t i = 0; i < dims_.L; ++i) layers_.push_back(layer_weights(store_, i));
  } else {
    K3_ASSERT(store_.expert_storage() == ExpertStorage::Plain, "K3ModelT<double> needs Plain experts");
    copy_.assign(store_.data(), store_.data() + store_.size());
    params_ = copy_.data();
    layers_.reserve(size_t(dims_.L));
    for (int64_t i = 0; i < dims_.L; ++i) layers_.push_back(layer_views<R>(store_.layout(), config(), params_, i));
  }
  const ParamLayout& lay = store_.layout();
  auto P = [&](const std::string& name) -> MatT<R> {
    if constexpr (std::is_same_v<R, float>) return store_.mat(name);
    else return params_ + lay.offset(lay.index(name));
  };
  embed_ = P(kModelPrefix + "embed_tokens.weight");
  final_res_norm_ = P(kOutputAttnResNormName);
  final_res_proj_ = P(kOutputAttnResProjName);
  final_norm_ = P(kModelPrefix + "norm.weight");
  lm_head_ = config().tie_word_embeddings ? embed_ : P(kLmHeadName);
}

template <typename R>
void K3ModelT<R>::set_expert_provider(std::shared_ptr<ExpertProvider> p) {
  K3_ASSERT((std::is_same_v<R, float>), "an expert provider serves the float engine only");
  K3_ASSERT(p || !store_.experts_external(), "a model whose experts are external needs an expert provider");
  provider_ = std::move(p);
  for (int64_t i = 0; i < dims_.L; ++i) {
    LatentMoEWeightsT<R>& m = layers_[size_t(i)].moe;
    if (!layers_[size_t(i)].is_moe) continue;
    m.provider = provider_.get();
    m.provider_layer = i;
  }
}

template <typename R>
void K3ModelT<R>::set_trunk_provider(std::shared_ptr<TrunkProvider> p) {
  K3_ASSERT((std::is_same_v<R, float>), "a trunk provider serves the float engine only");
  K3_ASSERT(p || !trunk_streamed_, "a model whose trunk is streamed needs a trunk provider");
  trunk_ = std::move(p);
}

template <typename R>
void K3ModelT<R>::set_head_provider(std::shared_ptr<HeadProvider> p) {
  K3_ASSERT((std::is_same_v<R, float>), "a head provider serves the float engine only");
  K3_ASSERT(p || !head_streamed_, "a model whose embedding and lm_head are streamed needs a head provider");
  K3_ASSERT(!p || p->block_rows() == head_block_rows_, "head provider: its block rows differ from the model's");
  head_ = std::move(p);
}

template <typename R>
void K3ModelT<R>::set_head_block_rows(int64_t rows) {
  K3_ASSERT(rows >= 1, "head block rows must be positive");
  K3_ASSERT(!head_ || head_->block_rows() == rows, "head block rows: the head provider reads other blocks");
  head_block_rows_ = std::min<int64_t>(rows, dims_.V);
}

int64_t lm_head_block_rows(const K3Config& c) {
  const int64_t d = std::max<int64_t>(c.hidden_size, 1), V = std::max<int64_t>(c.vocab_size, 1);
  const int64_t panel = bf16_panel_rows(d);
  const int64_t rows = std::max<int64_t>(1, (int64_t(32) << 20) / (2 * d) / panel) * panel;
  return std::min(rows, V);
}

namespace {

// begin_head / end_head of a head provider around one lm_head product (end_head on a throw too).
class HeadCall {
 public:
  explicit HeadCall(HeadProvider* p) : p_(p) { p_->begin_head(); }
  ~HeadCall() { p_->end_head(); }
  HeadCall(const HeadCall&) = delete;
  HeadCall& operator=(const HeadCall&) = delete;

 private:
  HeadProvider* p_;
};

}  // namespace

template <typename R>
void K3ModelT<R>::embed(R* dst, const int32_t* ids_host, const int32_t* ids_dev, int64_t T) const {
  const int64_t d = dims_.d;
  if constexpr (std::is_same_v<R, float>) {
    if (head_) return head_->embed_rows(dst, ids_host, T);
  }
  K3_ASSERT(!head_streamed_, "K3Model: the embedding is streamed but no head provider is set");
  ops_->embed_rows(dst, dev_ ? dev_embed() : embed_, ids_dev, T, d);
}

template <typename R>
void K3ModelT<R>::lm_head(R* logits, const R* h, int64_t rows) const {
  const int64_t d = dims_.d, V = dims_.V, br = head_block_rows_;
  K3_ASSERT(head_ || !head_streamed_, "K3Model: the lm_head is streamed but no head provider is set");
  if constexpr (std::is_same_v<R, float>) {
    if (head_) {
      HeadCall call(head_.get());
      for (int64_t b = 0, r0 = 0; r0 < V; ++b, r0 += br) {
        const Mat W = head_->acquire_block(b);
        gemm(false, true, rows, std::min(br, V - r0), d, 1.f, h, d, W, d, 0.f, logits + r0, V);
        head_->release_block(b);
      }
      return;
    }
  }
  const MatT<R> W = dev_ ? dev_lm_head() : lm_head_;
  for (int64_t r0 = 0; r0 < V; r0 += br)
    ops_->gemm(false, true, rows, std::min(br, V - r0), d, R(1), h, d, W.offset(r0 * d), d, R(0), logits + r0, V);
}

template <typename R>
const int32_t* K3ModelT<R>::stage_ids(const int32_t* ids, int64_t T, ForwardScratchT<R>& s) const {
  Device* dev = device();
  if (!dev) return ids;
  grow(s.ids, T, dev);
  s.ids.write(0, ids, size_t(T));
  return s.ids.data();
}

template <typename R>
R* K3ModelT<R>::device_logits(R* logits, int64_t rows, ForwardScratchT<R>& s) const {
  Device* dev = device();
  if (!dev) return logits;
  grow(s.logits, rows * dims_.V, dev);
  return s.logits.data();
}

template <typename R>
void K3ModelT<R>::finish_logits(R* logits, int64_t rows, ForwardScratchT<R>& s) const {
  if (device()) s.logits.read(logits, 0, size_t(rows * dims_.V));
}

template <typename R>
const LayerWeightsT<R>& K3ModelT<R>::layer_for_call(int64_t i) const {
  if constexpr (std::is_same_v<R, float>) {
    if (trunk_ && i >= trunk_->first_streamed()) {
      LayerWeights& w = trunk_->acquire(i);  // (CPU only: to_backend refuses a streamed trunk)
      // The next layer (or the next call's first streamed one) while this one computes.
      trunk_->prefetch(i + 1 < dims_.L ? i + 1 : trunk_->first_streamed());
      const LayerWeights& own = layers_[size_t(i)];
      w.moe.provider = own.moe.provider;
      w.moe.provider_layer = own.moe.provider_layer;
      return w;
    }
  }
  return dev_ ? dev_layer(i) : layers_[size_t(i)];
}

namespace {

// begin_call / end_call of a trunk provider around one forward call (end_call also on a throw).
class TrunkCall {
 public:
  explicit TrunkCall(TrunkProvider* p) : p_(p) {
    if (p_) p_->begin_call();
  }
  ~TrunkCall() {
    if (p_) p_->end_call();
  }
  TrunkCall(const TrunkCall&) = delete;
  TrunkCall& operator=(const TrunkCall&) = delete;
  void release(int64_t layer) {
    if (p_ && layer >= p_->first_streamed()) p_->release(layer);
  }

 private:
  TrunkProvider* p_;
};

}  // namespace

template <typename R>
DecodeStateT<R> K3ModelT<R>::new_state() const {
  DecodeStateT<R> st;
  st.reset(dims_, device());
  return st;
}

template <typename R>
void K3ModelT<R>::forward(R* logits, const int32_t* ids, int64_t T, DecodeStateT<R>& st, ForwardScratchT<R>& s,
                          const ForwardOptions& opt, ForwardRecordT<R>* rec, const EmbedSpliceT<R>* splice) const {
  const int64_t d = dims_.d, V = dims_.V;
  K3_ASSERT(int64_t(st.layers.size()) == dims_.L, "K3Model::forward: DecodeState not reset for this model");
  if (T <= 0) return;
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V)
      fail("token id " + std::to_string(ids[t]) + " at position " + std::to_string(t) +
           " is outside the vocabulary [0, " + std::to_string(V) + ")");

  // Before layer 0: partial = token embedding, no completed blocks.
  Device* dev = device();
  K3_ASSERT(!rec || !dev, "K3Model::forward: training runs on the CPU backend");
  st.move_to(dev);  // a state made for the host moves on first use
  const int32_t* ids_d = stage_ids(ids, T, s);
  BlockStateT<R>& bs = s.bs;
  if (rec) {  // the block stack is built in the record's own buffers (one buffer per role)
    bs.blocks.host().swap(rec->blocks);
    bs.partial.host().swap(rec->partial);
  }
  bs.begin(T, d, dims_.max_blocks(), dev);
  embed(bs.partial.data(), ids, ids_d, T);
  if (splice) {
    int64_t j = 0;
    for (int64_t t = 0; t < T; ++t)
      if (ids[t] == splice->media_id) {
        if (j < splice->n) bs.partial.write(size_t(t * d), splice->rows + j * d, size_t(d));
        ++j;
      }
    if (j != splice->n)
      fail("the sequence holds " + std::to_string(j) + " media placeholder token(s) (id " +
           std::to_string(splice->media_id) + ") but the images give " + std::to_string(splice->n) + " image token(s)");
  }

  if (rec) {
    K3_ASSERT(opt.mode == MixerMode::Prefill && st.n_tokens == 0, "K3Model::forward: a record needs a fresh Prefill");
    rec->T = T;
    rec->last_only = opt.last_only;
    rec->layers.resize(size_t(dims_.L));
  }
  K3_ASSERT(!((trunk_ || head_) && rec), "K3Model::forward: a training record needs the trunk resident");
  K3_ASSERT(trunk_ || !trunk_streamed_, "K3Model::forward: the trunk is streamed but no trunk provider is set");
  {
    TrunkCall call(trunk_.get());
    for (int64_t i = 0; i < dims_.L; ++i) {
      decoder_layer_forward<R>(*ops_, bs, st.layers[size_t(i)], layer_for_call(i), dims_, i, T, opt.mode,
                               opt.kda_path, s.layer, rec ? &rec->layers[size_t(i)] : nullptr);
      call.release(i);
    }
  }
  st.n_tokens += T;

  // Output: h = AttnRes_out(blocks + [partial]); final RMSNorm; lm_head.
  const int64_t row0 = opt.last_only ? T - 1 : 0, rows = T - row0;
  grow(s.h_out, rows * d, dev);
  grow(s.h_final, rows * d, dev);
  grow(s.rstd, rows, dev);
  grow(s.alpha, rows * (bs.n + 1), dev);  // attn_res_forward would allocate without a buffer
  R* alpha = s.alpha.data();
  if (rec) {
    rec->n_blocks = bs.n;
    rec->alpha_out.resize(size_t(rows * (bs.n + 1)));
    alpha = rec->alpha_out.data();
  }
  const OutputViews o = output_views();
  block_attn_res<R>(*ops_, s.h_out.data(), alpha, bs, o.res_norm, o.res_proj, row0, rows, dims_.eps, s.src);
  ops_->rmsnorm(s.h_final.data(), d, s.rstd.data(), s.h_out.data(), d, o.norm, rows, d, dims_.eps);
  lm_head(device_logits(logits, rows, s), s.h_final.data(), rows);
  finish_logits(logits, rows, s);
  if (rec) {
    rec->blocks.swap(bs.blocks.host());  // [>= n_blocks, T, d]: the first n_blocks are the stack
    rec->partial.swap(bs.partial.host());
    rec->h_out.assign(s.h_out.begin(), s.h_out.begin() + rows * d);
    rec->rstd_final.assign(s.rstd.begin(), s.rstd.begin() + rows);
    rec->h_final.assign(s.h_final.begin(), s.h_final.begin() + rows * d);
  }
}

template <typename R>
void K3ModelT<R>::forward_batch(R* logits, const int32_t* ids, const int64_t* seg, int64_t n_seg,
                                DecodeStateT<R>* const* states, ForwardScratchT<R>& s, KDAPath kda_path) const {
  forward_batch_impl(logits, ids, seg, n_seg, states, s, kda_path);
}

template <typename R>
const R* K3ModelT<R>::forward_batch_device(const int32_t* ids, const int64_t* seg, int64_t n_seg,
                                           DecodeStateT<R>* const* states, ForwardScratchT<R>& s,
                                           KDAPath kda_path) const {
  return forward_batch_impl(nullptr, ids, seg, n_seg, states, s, kda_path);
}

template <typename R>
const R* K3ModelT<R>::forward_batch_impl(R* logits, const int32_t* ids, const int64_t* seg, int64_t n_seg,
                                         DecodeStateT<R>* const* states, ForwardScratchT<R>& s,
                                         KDAPath kda_path) const {
  K3_ASSERT(n_seg >= 1 && seg[0] == 0, "K3Model::forward_batch: segments must start at row 0");
  const int64_t d = dims_.d, V = dims_.V, T = seg[n_seg];
  for (int64_t j = 0; j < n_seg; ++j) {
    K3_ASSERT(seg[j + 1] >= seg[j], "K3Model::forward_batch: segments out of order");
    K3_ASSERT(int64_t(states[j]->layers.size()) == dims_.L,
              "K3Model::forward_batch: DecodeState not reset for this model");
  }
  if (T <= 0) return nullptr;
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V)
      fail("token id " + std::to_string(ids[t]) + " at batch row " + std::to_string(t) +
           " is outside the vocabulary [0, " + std::to_string(V) + ")");
  Device* dev = device();
  for (int64_t j = 0; j < n_seg; ++j) states[j]->move_to(dev);
  const int32_t* ids_d = stage_ids(ids, T, s);
  BlockStateT<R>& bs = s.bs;
  bs.begin(T, d, dims_.max_blocks(), dev);
  embed(bs.partial.data(), ids, ids_d, T);
  s.seg_states.resize(size_t(n_seg));
  LayerBatchT<R> batch{seg, n_seg, s.seg_states.data()};
  K3_ASSERT(trunk_ || !trunk_streamed_, "K3Model::forward_batch: the trunk is streamed but no trunk provider is set");
  {
    TrunkCall call(trunk_.get());
    for (int64_t i = 0; i < dims_.L; ++i) {
      for (int64_t j = 0; j < n_seg; ++j) s.seg_states[size_t(j)] = &states[j]->layers[size_t(i)];
      decoder_layer_forward<R>(*ops_, bs, states[0]->layers[size_t(i)], layer_for_call(i), dims_, i, T,
                               MixerMode::Decode, kda_path, s.layer, nullptr, &batch);
      call.release(i);
    }
  }
  for (int64_t j = 0; j < n_seg; ++j) states[j]->n_tokens += seg[j + 1] - seg[j];
  grow(s.h_out, T * d, dev);
  grow(s.h_final, T * d, dev);
  grow(s.rstd, T, dev);
  grow(s.alpha, T * (bs.n + 1), dev);
  const OutputViews o = output_views();
  block_attn_res<R>(*ops_, s.h_out.data(), s.alpha.data(), bs, o.res_norm, o.res_proj, 0, T, dims_.eps, s.src);
  ops_->rmsnorm(s.h_final.data(), d, s.rstd.data(), s.h_out.data(), d, o.norm, T, d, dims_.eps);
  if (!logits) {  // left on the backend, in s.logits
    grow(s.logits, T * V, dev);
    lm_head(s.logits.data(), s.h_final.data(), T);
    return s.logits.data();
  }
  lm_head(device_logits(logits, T, s), s.h_final.data(), T);
  finish_logits(logits, T, s);
  return logits;
}

template LayerWeightsT<float> layer_views<float>(const ParamLayout&, const K3Config&, const float*, int64_t);
template LayerWeightsT<double> layer_views<double>(const ParamLayout&, const K3Config&, const double*, int64_t);
template struct DecodeStateT<float>;
template struct DecodeStateT<double>;
template class K3ModelT<float>;
template class K3ModelT<double>;

}  // namespace k3
