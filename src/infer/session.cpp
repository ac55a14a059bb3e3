// Decode session (see session.h).
#include "infer/session.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace k3 {

Session::Session(const K3Model& model, const SessionOptions& opt) : model_(model), opt_(opt) {
  logits_.resize(size_t(model_.dims().V));
  reset();
}

void Session::reset() {
  mark_tokens_ = -1;
  verify_ids_.clear();
  state_.reset(model_.dims(), model_.device());
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

const float* Session::verify(const int32_t* ids, int64_t T) {
  if (T <= 0) fail("verify needs at least one token");
  const ModelDims& d = model_.dims();
  verify_logged_ = opt_.decode_path == KDAPath::Fast;  // one token at a time: the decode step or Steps
  if (verify_logged_) {
    // The MLA caches' lengths suffice: the KDA states come back from the log.
    mark_mla_n_.assign(size_t(d.L), 0);
    for (int64_t i = 0; i < d.L; ++i)
      if (d.mla[size_t(i)]) mark_mla_n_[size_t(i)] = state_.layers[size_t(i)].mla.n;
    mark_tokens_ = -1;  // no KDA copies to rewind to
  } else {
    mark();
  }
  for (int64_t i = 0; i < d.L; ++i) state_.layers[size_t(i)].kda_log.enabled = verify_logged_ && !d.mla[size_t(i)];
  verify_start_ = state_.n_tokens;
  const float* rows = step_many(ids, T);
  for (int64_t i = 0; i < d.L; ++i) {
    KDAStepLog& log = state_.layers[size_t(i)].kda_log;
    K3_ASSERT(!log.enabled || log.tokens == T, "Session::verify: a KDA layer did not log the call");
    log.enabled = false;
  }
  verify_ids_.assign(ids, ids + T);
  return rows;
}

bool Session::keep_prefix(int64_t n) {
  const int64_t T = int64_t(verify_ids_.size());
  if (T == 0) fail("keep_prefix: no verify() since the last cut");
  if (n < 1 || n > T) fail("keep_prefix: " + std::to_string(n) + " tokens of a " + std::to_string(T) + "-token verify");
  std::vector<int32_t> ids;
  ids.swap(verify_ids_);  // one cut per verify
  if (n == T) return true;
  if (!verify_logged_) {
    rewind();
    step_many(ids.data(), n);
    return false;
  }
  const ModelDims& d = model_.dims();
  for (int64_t i = 0; i < d.L; ++i) {
    LayerState& l = state_.layers[size_t(i)];
    if (d.mla[size_t(i)]) l.mla.truncate(mark_mla_n_[size_t(i)] + n, d.mla_dims);
    else l.kda_log.restore(l.kda, n);
  }
  state_.n_tokens = verify_start_ + n;
  const int64_t V = model_.dims().V;
  std::copy(rows_.begin() + (n - 1) * V, rows_.begin() + n * V, logits_.begin());  // of the last kept token
  return true;
}

}  // namespace k3
