#include "infer/json_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "infer/json_schema.h"

namespace k3 {

JsonVocab::Trie JsonVocab::build(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids_in) {
  std::vector<int32_t> ids = ids_in;
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes[size_t(a)] < bytes[size_t(b)] || (bytes[size_t(a)] == bytes[size_t(b)] && a < b);
  });
  Trie t;
  t.byte.push_back(0), t.depth.push_back(0), t.end.push_back(0), t.tok.push_back(0);
  // In sorted order a prefix comes before its extensions, so nodes are created in preorder;
  // path[d] is the node of the current prefix's first d bytes.
  std::vector<uint32_t> path = {0};
  std::string_view prev;
  for (int32_t id : ids) {
    const std::string_view s = bytes[size_t(id)];
    K3_ASSERT(s.size() < 65535, "token " + std::to_string(id) + " is too long");
    size_t l = 0;
    while (l < s.size() && l < prev.size() && s[l] == prev[l]) ++l;
    if (l == s.size() && l == prev.size() && !t.ids.empty()) {  // same bytes as the previous id
      t.ids.push_back(id);
      continue;
    }
    while (path.size() > l + 1) {
      t.end[path.back()] = uint32_t(t.byte.size());
      path.pop_back();
    }
    for (size_t d = l + 1; d <= s.size(); ++d) {
      path.push_back(uint32_t(t.byte.size()));
      t.byte.push_back(uint8_t(s[d - 1]));
      t.depth.push_back(uint16_t(d));
      t.end.push_back(0);
      t.tok.push_back(uint32_t(t.ids.size()));
    }
    t.ids.push_back(id);
    t.max_depth = std::max(t.max_depth, int(s.size()));
    prev = s;
  }
  while (!path.empty()) {
    t.end[path.back()] = uint32_t(t.byte.size());
    path.pop_back();
  }
  t.tok.push_back(uint32_t(t.ids.size()));
  return t;
}

JsonVocab::JsonVocab(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  // Plain string text: from inside a string, every byte is taken and the string stays open
  // and between characters. The string lexer's behaviour does not depend on what encloses the
  // string, so such a token is allowed in every plain-string state.
  const auto any = json_any_grammar();
  JsonMachine open(*any);
  K3_ASSERT(open.step('"'));
  plain_text_.assign(bytes_.size(), 0);
  std::vector<int32_t> with_bytes, non_text;
  for (int32_t id = 0; id < size(); ++id) {
    const std::string& s = bytes_[size_t(id)];
    if (s.empty()) continue;
    with_bytes.push_back(id);
    JsonMachine m = open;
    bool ok = true;
    for (char c : s) {
      ok = m.step(uint8_t(c)) && m.depth() == 1;
      if (!ok) break;
    }
    if (ok && m.in_plain_string()) plain_text_[size_t(id)] = 1;
    else non_text.push_back(id);
  }
  all_ = build(bytes_, with_bytes);
  non_text_ = build(bytes_, non_text);
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonVocab> vocab, std::shared_ptr<const JsonGrammar> grammar,
                               std::vector<int32_t> terminals)
    : vocab_(std::move(vocab)), grammar_(std::move(grammar)), terminals_(std::move(terminals)), machine_(*grammar_) {
  K3_ASSERT(vocab_ && grammar_);
  if (terminals_.empty()) fail("json constraint: at least one terminal id is needed");
  for (int32_t t : terminals_)
    if (t < 0) fail("json constraint: terminal id " + std::to_string(t) + " is negative");
  states_.assign(size_t(vocab_->all_.max_depth + 1), machine_);
}

void JsonConstraint::walk(const JsonVocab::Trie& t, std::vector<uint8_t>& allowed, int64_t& n) {
  states_[0] = machine_;
  const uint32_t N = uint32_t(t.byte.size());
  for (uint32_t i = 1; i < N;) {
    const int d = t.depth[i];
    JsonMachine& s = states_[size_t(d)];
    s = states_[size_t(d - 1)];
    if (!s.step(t.byte[i])) {
      i = t.end[i];  // no token below this prefix can follow
      continue;
    }
    for (uint32_t k = t.tok[i]; k < t.tok[i + 1]; ++k) {
      const int32_t id = t.ids[k];
      n += !allowed[size_t(id)];
      allowed[size_t(id)] = 1;
    }
    ++i;
  }
}

int64_t JsonConstraint::allowed_ids(std::vector<uint8_t>& allowed, int64_t vocab) {
  if (vocab < vocab_->size())
    fail("json constraint: the logits have " + std::to_string(vocab) + " entries, fewer than the vocabulary's " +
         std::to_string(vocab_->size()) + " ids");
  allowed.assign(size_t(vocab), 0);
  int64_t n = 0;
  if (!finished_) {
    if (machine_.in_plain_string()) {
      std::memcpy(allowed.data(), vocab_->plain_text_.data(), vocab_->plain_text_.size());
      n = std::accumulate(vocab_->plain_text_.begin(), vocab_->plain_text_.end(), int64_t(0));
      walk(vocab_->non_text_, allowed, n);
    } else {
      walk(vocab_->all_, allowed, n);
    }
  }
  if (finished_ || machine_.complete())
    for (int32_t t : terminals_)
      if (t < vocab && !allowed[size_t(t)]) allowed[size_t(t)] = 1, ++n;
  // The automaton has no dead ends, so this fails only for a vocabulary that cannot spell a
  // byte the grammar needs (e.g. one without all 256 single bytes): a setup bug.
  K3_ASSERT(n > 0, "json constraint: no token can follow '" + text_ + "'");
  return n;
}

void JsonConstraint::mask(float* logits, int64_t vocab) {
  allowed_ids(allowed_, vocab);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i)
    if (!allowed_[size_t(i)]) logits[i] = ninf;
}

void JsonConstraint::accept(int32_t id) {
  const bool terminal = std::find(terminals_.begin(), terminals_.end(), id) != terminals_.end();
  if (finished_) {
    if (!terminal) fail("json constraint: token " + std::to_string(id) + " after the end of the JSON value");
    return;
  }
  if (terminal && machine_.complete()) {
    finished_ = true;
    return;
  }
  JsonMachine m = machine_;
  if (!vocab_->has_bytes(id) || !m.feed(vocab_->bytes(id)))
    fail("json constraint: token " + std::to_string(id) + " cannot follow '" + text_ + "'");
  machine_ = m;
  text_ += vocab_->bytes(id);
}

}  // namespace k3
