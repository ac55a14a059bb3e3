// The vocabulary a model is trained and run with, one of two kinds behind one interface:
//  - bytes: k3cpp's byte tokenizer (io/tokenizer.h): ids 0-255 are raw bytes, then
//    <|bos|> 256, <|eos|> 257, <|pad|> 258, <|sep|> 259; saved as tokenizer.json.
//  - tiktoken: a BPE vocabulary in K3's format (io/tiktoken.h): tiktoken.model, then the 256
//    special ids of tokenizer_config.json; BOS is [BOS] and EOS is [EOS] (K3's layout,
//    io/tiktoken_config.h), so a config that names neither is refused.
// Both give ordinary-text encoding (special names in the text stay text), BOS/EOS, the id
// count, the byte length of every id (0 for special ids: the denominator of bits per byte,
// so held-out bits per byte compare across vocabularies) and a Tiktoken view for
// io/stream_decoder.h. The byte tokenizer's view is the 256 single bytes plus its specials,
// which decodes exactly as ByteTokenizer does. Encoding with the byte tokenizer keeps raw
// bytes (no U+FFFD replacement), as before: the corpora of existing runs tokenise alike.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/tiktoken.h"
#include "io/tokenizer.h"

namespace k3 {

class Vocabulary {
 public:
  Vocabulary();  // the default byte tokenizer
  explicit Vocabulary(const ByteTokenizer& t, std::string source = "");
  // `model_text` / `config_text`: the contents of tiktoken.model / tokenizer_config.json
  // (what save() writes); `source`: where they came from (messages only).
  static Vocabulary from_tiktoken(std::string model_text, std::string config_text, const std::string& source);
  // DIR/tiktoken.model (+ DIR/tokenizer_config.json). k3::Error naming the file and
  // line/field: missing or corrupt files, no [BOS] / [EOS].
  static Vocabulary load_tiktoken_dir(const std::string& dir);
  // A model directory's: tiktoken.model when present, else tokenizer.json; k3::Error when
  // it has neither (naming the directory) or a file is bad (naming it).
  static Vocabulary load_dir(const std::string& dir);
  static bool dir_has_tiktoken(const std::string& dir);
  static bool dir_has_byte_tokenizer(const std::string& dir);

  bool is_bytes() const { return bool(bytes_); }
  const char* kind() const { return bytes_ ? "bytes" : "tiktoken"; }
  // "tiktoken vocabulary runs/x/tokenizer (2048 ids: 1792 base + 256 special)" or
  // "byte tokenizer (260 ids)".
  std::string describe() const;

  std::vector<int32_t> encode(std::string_view text) const;
  // Documents encoded in parallel (tiktoken: Tiktoken::encode_batch) or one by one (bytes).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& docs) const;
  // Raw bytes of the ids (special ids as their names).
  std::string decode_bytes(const std::vector<int32_t>& ids) const;

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int64_t vocab_size() const { return int64_t(token_bytes_.size()); }
  // Per id: the number of bytes it decodes to; 0 for special ids.
  const std::vector<int32_t>& token_bytes() const { return token_bytes_; }
  const Tiktoken& decoder() const { return *tik_; }

  // Writes the vocabulary's files into `dir` (created): tokenizer.json, or tiktoken.model and
  // tokenizer_config.json, each atomically (temporary name + rename).
  void save(const std::string& dir) const;
  // Equal exactly when the two vocabularies' files are equal.
  std::string identity() const;

 private:
  std::optional<ByteTokenizer> bytes_;
  std::shared_ptr<const Tiktoken> tik_;
  std::string model_text_, config_text_, source_;
  int32_t bos_ = -1, eos_ = -1;
  std::vector<int32_t> token_bytes_;
  void fill_token_bytes();
};

}  // namespace k3
