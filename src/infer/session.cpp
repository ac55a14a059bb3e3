// Decode session (see session.h).
#include "infer/session.h"

#include "core/error.h"

namespace k3 {

Session::Session(const K3Model& model, const SessionOptions& opt) : model_(model), opt_(opt) {
  logits_.resize(size_t(model_.dims().V));
  reset();
}

void Session::reset() {
  mark_tokens_ = -1;
  state_.reset(model_.dims());
  if (opt_.reserve_tokens > 0) state_.reserve(opt_.reserve_tokens, model_.dims());
}

const float* Session::prefill(const int32_t* ids, int64_t T) { return prefill(ids, T, nullptr); }

const float* Session::prefill(const int32_t* ids, int64_t T, const EmbedSpliceT<float>* splice) {
  if (T <= 0) fail("prefill needs at least one token");
  ForwardOptions fo;
  fo.mode = MixerMode::Prefill;
  fo.kda_path = opt_.prefill_path;
  fo.last_only = true;
  model_.forward(logits_.data(), ids, T, state_, scratch_, fo, nullptr, splice);
  return logits_.data();
}

const float* Session::step(int32_t id) {
  ForwardOptions fo;
  fo.mode = MixerMode::Decode;
  fo.kda_path = opt_.decode_path;
  fo.last_only = true;
  model_.forward(logits_.data(), &id, 1, state_, scratch_, fo);
  return logits_.data();
}

const float* Session::step_many(const int32_t* ids, int64_t T) {
  if (T <= 0) fail("step_many needs at least one token");
  const int64_t V = model_.dims().V;
  rows_.resize(size_t(T * V));
  ForwardOptions fo;
  fo.mode = MixerMode::Decode;
  fo.kda_path = opt_.decode_path;
  model_.forward(rows_.data(), ids, T, state_, scratch_, fo);
  std::copy(rows_.end() - V, rows_.end(), logits_.begin());
  return rows_.data();
}

void Session::mark() {
  const ModelDims& d = model_.dims();
  mark_kda_.resize(size_t(d.L));
  mark_mla_n_.assign(size_t(d.L), 0);
  for (int64_t i = 0; i < d.L; ++i) {
    if (d.mla[size_t(i)]) mark_mla_n_[size_t(i)] = state_.layers[size_t(i)].mla.n;
    else mark_kda_[size_t(i)] = state_.layers[size_t(i)].kda;  // copy assignment reuses capacity
  }
  mark_tokens_ = state_.n_tokens;
}

void Session::rewind() {
  K3_ASSERT(mark_tokens_ >= 0, "Session::rewind without a mark");
  const ModelDims& d = model_.dims();
  for (int64_t i = 0; i < d.L; ++i) {
    if (d.mla[size_t(i)]) state_.layers[size_t(i)].mla.truncate(mark_mla_n_[size_t(i)], d.mla_dims);
    else state_.layers[size_t(i)].kda = mark_kda_[size_t(i)];
  }
  state_.n_tokens = mark_tokens_;
}

}  // namespace k3
