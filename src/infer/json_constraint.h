// Constrained decoding of JSON (OpenAI response_format json_object / json_schema): the logits of
// every token whose bytes the grammar's automaton (infer/json_grammar.h) cannot take next are
// set to -inf, so whatever the model's logits, the sampled text is a prefix of a valid value,
// and once the value is complete only the terminal ids (e.g. the end of the message) remain.
//
// JsonVocab holds the vocabulary once per tokenizer (shared by every request): each id's bytes
// ("" for special/control ids, which are never allowed inside the JSON) arranged as a byte trie
// in preorder with subtree-end links, so mask() walks it depth first with one automaton state
// per depth, simulating each shared prefix once and skipping a whole subtree at its first
// rejected byte. Inside a string (the common case) the tokens that are plain string text
// (valid UTF-8 without '"', '\' or control bytes) are allowed without a walk, and only the
// others are walked, from a second trie.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "infer/engine.h"
#include "infer/json_grammar.h"

namespace k3 {

class JsonVocab {
 public:
  explicit JsonVocab(std::vector<std::string> token_bytes);  // indexed by id
  int32_t size() const { return int32_t(bytes_.size()); }
  bool has_bytes(int32_t id) const { return id >= 0 && id < size() && !bytes_[size_t(id)].empty(); }
  std::string_view bytes(int32_t id) const { return bytes_[size_t(id)]; }

 private:
  friend class JsonConstraint;
  // Preorder byte trie: node i (i >= 1) appends byte[i] to its parent's prefix, has depth[i]
  // bytes, and its subtree is [i, end[i]); the ids spelled by node i are ids[tok[i]..tok[i+1]).
  struct Trie {
    std::vector<uint8_t> byte;
    std::vector<uint16_t> depth;
    std::vector<uint32_t> end, tok;
    std::vector<int32_t> ids;
    int max_depth = 0;
  };
  static Trie build(const std::vector<std::string>& bytes, const std::vector<int32_t>& ids);

  std::vector<std::string> bytes_;
  Trie all_, non_text_;             // every token with bytes; those that are not plain string text
  std::vector<uint8_t> plain_text_; // [size] 1: plain string text
};

class JsonConstraint : public LogitConstraint {
 public:
  // `terminals`: the ids allowed once the value is complete (at least one; they need no bytes).
  JsonConstraint(std::shared_ptr<const JsonVocab> vocab, std::shared_ptr<const JsonGrammar> grammar,
                 std::vector<int32_t> terminals);

  // Ids >= the vocabulary's size (padding rows of the logits) are masked unless terminal.
  // After a terminal was accepted only the terminals stay allowed.
  void mask(float* logits, int64_t vocab) override;
  // k3::Error if `id` is not allowed here (the caller sampled from unmasked logits).
  void accept(int32_t id) override;

  // The allowed ids of the current state, into `allowed` (resized to vocab, 1 = allowed);
  // returns how many.
  int64_t allowed_ids(std::vector<uint8_t>& allowed, int64_t vocab);
  bool complete() const { return machine_.complete(); }  // a terminal may come next
  bool finished() const { return finished_; }             // a terminal was accepted
  const std::string& text() const { return text_; }       // the JSON bytes accepted so far
  const std::vector<int32_t>& terminals() const { return terminals_; }
  const JsonVocab& vocab() const { return *vocab_; }

 private:
  void walk(const JsonVocab::Trie& t, std::vector<uint8_t>& allowed, int64_t& n);

  std::shared_ptr<const JsonVocab> vocab_;
  std::shared_ptr<const JsonGrammar> grammar_;
  std::vector<int32_t> terminals_;
  JsonMachine machine_;
  bool finished_ = false;
  std::string text_;
  std::vector<JsonMachine> states_;  // walk: the state after each depth's prefix
  std::vector<uint8_t> allowed_;
};

}  // namespace k3
