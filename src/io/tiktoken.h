// A tiktoken-style BPE tokenizer as K3 uses it: a `tiktoken.model` rank table, the 256
// special ids after it (tokenizer_config.json), a regex pre-tokenizer (Kimi's by default;
// cl100k_base's and o200k_base's to check the BPE core on shipped vocabularies).
// Encoding follows the reference exactly: invalid UTF-8 becomes U+FFFD first (the reference
// takes Python strings); with the Kimi pattern the long-input rule (io/long_text.h) cuts the
// text; each piece is split by the pattern and each match byte-pair merged. Encoding is by
// segments: control segments may produce special ids, text segments never do (a `<|open|>`
// in user text is ordinary text), and no merge crosses a segment boundary. BOS is never
// added. Where one special name is a prefix of another the longer one wins (the reference's
// choice then depends on hash-map order; K3's names never overlap so).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/bpe_ranks.h"
#include "io/pretokenizer.h"
#include "io/tiktoken_config.h"

namespace k3 {

struct Segment {
  std::string text;
  bool allow_special = false;
};

class Tiktoken {
 public:
  // `path`: a tiktoken.model file, or a directory holding tiktoken.model and optionally
  // tokenizer_config.json. k3::Error naming the file and line/field on bad input.
  static Tiktoken load(const std::string& path, PatternKind pattern = PatternKind::kimi);
  // From parts; `specials` must be the ids base..base+N-1 (any names, distinct).
  Tiktoken(BpeRanks ranks, std::vector<SpecialToken> specials, PatternKind pattern);

  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  void encode_append(std::string_view text, bool allow_special, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode_segments(const std::vector<Segment>& segments) const;
  // Documents encoded in parallel over `threads` threads (<= 0: k3::num_threads()).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& docs, int threads = 0) const;

  // Raw bytes of the ids (special ids as their names); k3::Error for an unknown id.
  std::string decode_bytes(const std::vector<int32_t>& ids) const;
  // decode_bytes with invalid UTF-8 replaced by U+FFFD.
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string_view token_bytes(int32_t id) const;  // k3::Error for an unknown id

  int32_t base_size() const { return ranks_.size(); }
  int32_t vocab_size() const { return ranks_.size() + int32_t(specials_.size()); }
  PatternKind pattern() const { return pattern_; }
  const BpeRanks& ranks() const { return ranks_; }
  const std::vector<SpecialToken>& specials() const { return specials_; }
  int32_t special_id(const std::string& name) const;  // k3::Error if absent
  bool is_special(int32_t id) const { return id >= base_size() && id < vocab_size(); }

 private:
  // Pre-tokenize and merge valid UTF-8 without specials.
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  BpeRanks ranks_;
  std::vector<SpecialToken> specials_;
  std::unordered_map<std::string, int32_t> special_ids_;
  std::vector<size_t> special_lengths_;  // distinct name lengths, longest first
  bool special_first_[256] = {};         // bytes that start some special name
  PatternKind pattern_;
  Pretokenizer pretok_;
};

}  // namespace k3
