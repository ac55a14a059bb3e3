#include "infer/chat_json_constraint.h"

#include <limits>

#include "core/error.h"
#include "io/chat_render.h"

namespace k3 {

ChatJsonConstraint::ChatJsonConstraint(bool reasoning, int32_t close_id, std::vector<int32_t> transition,
                                       std::shared_ptr<JsonConstraint> json, std::vector<int32_t> suffix,
                                       int64_t max_reasoning_tokens)
    : close_id_(close_id),
      transition_(std::move(transition)),
      suffix_(std::move(suffix)),
      json_(std::move(json)),
      max_reasoning_(max_reasoning_tokens),
      phase_(reasoning ? Phase::reasoning : Phase::content) {
  K3_ASSERT(json_ != nullptr);
  if (suffix_.empty()) fail("chat json constraint: the suffix is empty");
  if (json_->terminals() != std::vector<int32_t>{suffix_.front()})
    fail("chat json constraint: the JSON constraint's terminal must be the suffix's first id");
  if (max_reasoning_ < 0) fail("chat json constraint: max_reasoning_tokens must be >= 0");
  if (phase_ == Phase::content && json_->finished()) phase_ = Phase::suffix, pos_ = 1;
}

void ChatJsonConstraint::force(float* logits, int64_t vocab, int32_t id) {
  K3_ASSERT(id >= 0 && id < vocab, "forced id " + std::to_string(id) + " outside the logits");
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i)
    if (i != id) logits[i] = ninf;
}

void ChatJsonConstraint::mask(float* logits, int64_t vocab) {
  switch (phase_) {
    case Phase::reasoning: {
      if (reasoning_tokens_ >= max_reasoning_) return force(logits, vocab, close_id_);
      // Free text: any id with bytes, and the close; other control ids would leave the format.
      const JsonVocab& v = json_->vocab();
      const float ninf = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < vocab; ++i)
        if (i != close_id_ && !v.has_bytes(int32_t(i))) logits[i] = ninf;
      return;
    }
    case Phase::transition: return force(logits, vocab, transition_[pos_]);
    case Phase::content: return json_->mask(logits, vocab);
    case Phase::suffix: return force(logits, vocab, suffix_[pos_]);
    case Phase::done: return force(logits, vocab, suffix_.back());
  }
}

// The forced sequence `seq` advanced by one; at its end, the next phase.
void ChatJsonConstraint::after_forced(const std::vector<int32_t>& seq, Phase next) {
  if (++pos_ < seq.size()) return;
  pos_ = 0;
  phase_ = next;
}

void ChatJsonConstraint::accept(int32_t id) {
  auto expect = [&](int32_t want) {
    if (id != want)
      fail("chat json constraint: token " + std::to_string(id) + " where " + std::to_string(want) + " is forced");
  };
  switch (phase_) {
    case Phase::reasoning:
      if (id == close_id_) {
        phase_ = transition_.empty() ? Phase::content : Phase::transition;
        pos_ = 0;
        return;
      }
      if (reasoning_tokens_ >= max_reasoning_) expect(close_id_);
      if (!json_->vocab().has_bytes(id))
        fail("chat json constraint: control token " + std::to_string(id) + " inside the reasoning");
      ++reasoning_tokens_;
      return;
    case Phase::transition:
      expect(transition_[pos_]);
      return after_forced(transition_, Phase::content);
    case Phase::content:
      json_->accept(id);
      if (json_->finished()) {
        // The terminal was suffix[0]; the rest of the suffix is forced.
        phase_ = suffix_.size() > 1 ? Phase::suffix : Phase::done;
        pos_ = 1;
      }
      return;
    case Phase::suffix:
      expect(suffix_[pos_]);
      return after_forced(suffix_, Phase::done);
    case Phase::done: expect(suffix_.back()); return;
  }
}

K3ChatJsonIds k3_chat_json_ids(const Tiktoken& tok) {
  const int32_t close = tok.special_id(chat::kClose), sep = tok.special_id(chat::kSep);
  const int32_t open = tok.special_id(chat::kOpen), end = tok.special_id(chat::kEndOfMsg);
  auto text = [&](const char* s) { return tok.encode(s); };
  auto cat = [](std::vector<int32_t>& out, const std::vector<int32_t>& more) { out.insert(out.end(), more.begin(), more.end()); };
  K3ChatJsonIds ids;
  ids.close = close;
  cat(ids.transition, text("think"));
  cat(ids.transition, {sep, open});
  cat(ids.transition, text("response"));
  ids.transition.push_back(sep);
  ids.suffix.push_back(close);
  cat(ids.suffix, text("response"));
  cat(ids.suffix, {sep, close});
  cat(ids.suffix, text("message"));
  cat(ids.suffix, {sep, end});
  return ids;
}

std::vector<std::string> token_byte_table(const Tiktoken& tok) {
  std::vector<std::string> out(size_t(tok.vocab_size()));
  for (int32_t id = 0; id < tok.base_size(); ++id) out[size_t(id)] = std::string(tok.token_bytes(id));
  return out;
}

}  // namespace k3
