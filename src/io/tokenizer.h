// Byte-level tokenizer of models trained by k3cpp: ids 0-255 are raw bytes, then special
// tokens. Saved beside a checkpoint as tokenizer.json:
//   {"type": "k3cpp-byte", "version": 1, "special_tokens": {"<|bos|>": 256, ...}}
// A tokenizer.json of any other type is refused with a clear message (the released K3
// tokenizer is not supported yet).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace k3 {

class ByteTokenizer {
 public:
  ByteTokenizer();  // default specials: <|bos|> 256, <|eos|> 257, <|pad|> 258, <|sep|> 259
  static ByteTokenizer load(const std::string& path);  // k3::Error naming the file and field
  void save(const std::string& path) const;            // atomic write
  std::string to_json() const;

  std::vector<int32_t> encode(const std::string& text) const;  // bytes only, no specials added
  // Bytes for ids < 256; special tokens are rendered as their names.
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode_one(int32_t id) const;

  int64_t vocab_size() const { return 256 + int64_t(specials_.size()); }
  int32_t special(const std::string& name) const;  // k3::Error if absent
  int32_t bos() const { return special("<|bos|>"); }
  int32_t eos() const { return special("<|eos|>"); }
  const std::map<std::string, int32_t>& specials() const { return specials_; }

 private:
  std::map<std::string, int32_t> specials_;
};

}  // namespace k3
