// A decode session over one K3Model: the model's DecodeState for one sequence (per KDA layer
// the recurrent and conv states, per MLA layer the latent cache) and the scratch buffers.
// prefill() appends tokens through the multi-token path (chunked/fast KDA core, MLA expanded
// over the latent cache); step() appends one token through the decode path (the KDA decode
// step, MLA attending over the latent cache with absorbed projections). Both return the
// logits of the last appended position; prefill + steps equal one full forward over the same
// tokens up to float rounding (tests/infer/test_session.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "model/k3_model.h"

namespace k3 {

struct SessionOptions {
  KDAPath prefill_path = KDAPath::Fast;  // KDA core of prefill calls
  KDAPath decode_path = KDAPath::Fast;   // decode step variant (Fast: kda_decode_step_fast)
  int64_t reserve_tokens = 0;            // pre-size the MLA caches
};

class Session {
 public:
  explicit Session(const K3Model& model, const SessionOptions& opt = {});

  // Appends ids [T] (T >= 1); returns the logits [V] of the last one (valid until the next call).
  const float* prefill(const int32_t* ids, int64_t T);
  const float* prefill(const std::vector<int32_t>& ids) { return prefill(ids.data(), int64_t(ids.size())); }
  // The same with image tokens in place of the media placeholders (model/k3_model.h EmbedSpliceT).
  const float* prefill(const int32_t* ids, int64_t T, const EmbedSpliceT<float>* splice);
  // Appends one token; returns its logits [V].
  const float* step(int32_t id);
  // Appends ids [T] through the decode path (KDA token by token, MLA absorbed) and returns the
  // logits of every appended position, [T, V] (valid until the next call); logits() is the
  // last row. Speculative decoding's verification pass (infer/speculative.h).
  const float* step_many(const int32_t* ids, int64_t T);
  // mark() remembers the sequence as it is (the KDA states and conv windows copied, each MLA
  // cache's length: the cache is append-only); rewind() returns to it exactly, dropping what
  // was appended since. One mark at a time; reset() clears it.
  void mark();
  void rewind();
  // Speculative decoding's verification pass: step_many over ids [T] (T >= 1), ready for
  // keep_prefix. On the Fast decode path every KDA layer logs its state after each token but
  // the last (model/kda_mixer.h KDAStepLog; T - 1 states per KDA layer), otherwise it marks.
  // Replaces the mark.
  const float* verify(const int32_t* ids, int64_t T);
  // Cuts the last verify() back to its first n tokens (1 <= n <= T) exactly: from the log (the
  // KDA states restored, the MLA caches truncated) and returns true, or, without a log, rewinds
  // and appends the n tokens again (one more pass) and returns false. Either way logits() is
  // then the n-th token's.
  bool keep_prefix(int64_t n);
  void reset();  // back to an empty sequence (caches keep their capacity)

  int64_t position() const { return state_.n_tokens; }  // tokens consumed
  int64_t vocab() const { return model_.dims().V; }
  const float* logits() const { return logits_.data(); }  // of the last call
  const K3Model& model() const { return model_; }
  const DecodeState& state() const { return state_; }

 private:
  const K3Model& model_;
  SessionOptions opt_;
  DecodeState state_;
  ForwardScratch scratch_;
  std::vector<float> logits_;  // [V]
  std::vector<float> rows_;    // [T, V] of step_many
  std::vector<KDAState> mark_kda_;  // [L] (MLA layers: unused)
  std::vector<int64_t> mark_mla_n_;  // [L]
  int64_t mark_tokens_ = -1;         // -1: no mark
  std::vector<int32_t> verify_ids_;  // of the last verify() (empty: none since the last cut)
  bool verify_logged_ = false;       // its KDA states are in the layers' step logs
  int64_t verify_start_ = 0;         // tokens before it
};

}  // namespace k3
