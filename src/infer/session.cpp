// Decode session (see session.h).
#include "infer/session.h"

#include "core/error.h"

namespace k3 {

Session::Session(const K3Model& model, const SessionOptions& opt) : model_(model), opt_(opt) {
  logits_.resize(size_t(model_.dims().V));
  reset();
}

void Session::reset() {
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

}  // namespace k3
