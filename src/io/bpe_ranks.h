// The rank table of a tiktoken-style vocabulary (token bytes -> rank; the rank is both the
// token id and the merge priority) and the byte-pair merge of tiktoken's Rust core: start
// from single bytes, repeatedly merge the adjacent pair whose concatenation has the lowest
// rank (the leftmost on a tie) until no adjacent concatenation is a token.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

class BpeRanks {
 public:
  BpeRanks() = default;
  // Adds a token with the next rank (size()); false if those bytes are already a token.
  bool add(std::string_view bytes);
  int32_t size() const { return int32_t(offsets_.size()) - 1; }
  // Rank of `bytes`, -1 if not a token.
  int32_t find(std::string_view bytes) const;
  std::string_view bytes(int32_t rank) const {
    return {arena_.data() + offsets_[rank], size_t(offsets_[rank + 1] - offsets_[rank])};
  }
  // Whether every single byte 0..255 is a token (needed to encode arbitrary text).
  bool has_all_bytes() const;

  // Appends the tokens of one pre-tokenized piece: the whole piece if it is a token, else
  // the byte-pair merge. Throws k3::Error if a byte is not a token (incomplete vocabulary).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // The merge result as piece boundaries, for tests: [0, b1, b2, ..., piece.size()].
  std::vector<size_t> merge_boundaries(std::string_view piece) const;

 private:
  void grow();
  static uint64_t hash(std::string_view s);
  void merge_small(std::string_view piece, std::vector<size_t>& starts) const;
  void merge_large(std::string_view piece, std::vector<size_t>& starts) const;

  std::string arena_;             // all token bytes, concatenated in rank order
  std::vector<uint64_t> offsets_{0};  // rank r's bytes are arena_[offsets_[r], offsets_[r+1])
  std::vector<int32_t> slots_;     // open addressing: rank or -1
  uint64_t mask_ = 0;
};

}  // namespace k3
