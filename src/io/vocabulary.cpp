// Byte tokenizer or tiktoken vocabulary behind one interface (see vocabulary.h).
#include "io/vocabulary.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/tiktoken_config.h"
#include "io/tiktoken_file.h"

namespace k3 {

namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_system("cannot open", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail_system("cannot read", path);
  return ss.str();
}

bool is_file(const std::string& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

}  // namespace

Vocabulary::Vocabulary() : Vocabulary(ByteTokenizer()) {}

Vocabulary::Vocabulary(const ByteTokenizer& t, std::string source) : bytes_(t), source_(std::move(source)) {
  BpeRanks ranks;
  for (int b = 0; b < 256; ++b) {
    const char c = char(b);
    ranks.add(std::string_view(&c, 1));
  }
  std::vector<SpecialToken> specials(t.specials().size());
  // ByteTokenizer's special ids are 256, 257, ... (its loader checks), as Tiktoken's must be.
  for (const auto& [name, id] : t.specials()) specials[size_t(id - 256)] = {id, name, true};
  tik_ = std::make_shared<const Tiktoken>(std::move(ranks), std::move(specials), PatternKind::kimi);
  bos_ = t.bos(), eos_ = t.eos();
  fill_token_bytes();
}

Vocabulary Vocabulary::from_tiktoken(std::string model_text, std::string config_text, const std::string& source) {
  const std::string model_path = (fs::path(source) / "tiktoken.model").string();
  const std::string config_path = (fs::path(source) / "tokenizer_config.json").string();
  BpeRanks ranks = parse_tiktoken_model(model_text, model_path);
  if (!ranks.has_all_bytes())
    fail_input(model_path, "", "does not hold all 256 single bytes (k3cpp needs them to encode any text)");
  std::vector<SpecialToken> specials = config_text.empty() ? read_special_tokens("", ranks.size())
                                                           : parse_special_tokens(config_text, config_path, ranks.size());
  Vocabulary v;
  v.bytes_.reset();
  v.tik_ = std::make_shared<const Tiktoken>(std::move(ranks), std::move(specials), PatternKind::kimi);
  v.model_text_ = std::move(model_text);
  v.config_text_ = std::move(config_text);
  v.source_ = source;
  v.bos_ = v.eos_ = -1;
  for (const SpecialToken& s : v.tik_->specials()) {
    if (s.name == "[BOS]") v.bos_ = s.id;
    if (s.name == "[EOS]") v.eos_ = s.id;
  }
  if (v.bos_ < 0 || v.eos_ < 0)
    fail_input(config_path, "added_tokens_decoder",
               std::string(v.config_text_.empty() ? "missing file, so " : "") +
                   "no [BOS] / [EOS] token is named (k3cpp trains and generates with K3's layout: [BOS] at the base "
                   "vocabulary size, [EOS] after it)");
  v.fill_token_bytes();
  return v;
}

Vocabulary Vocabulary::load_tiktoken_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail_input(dir, "", "no such tokenizer directory (it holds tiktoken.model and tokenizer_config.json)");
  const std::string model = (fs::path(dir) / "tiktoken.model").string();
  const std::string config = (fs::path(dir) / "tokenizer_config.json").string();
  if (!is_file(model))
    fail_input(model, "", "missing (a tiktoken vocabulary directory holds tiktoken.model and tokenizer_config.json)");
  return from_tiktoken(read_all(model), is_file(config) ? read_all(config) : std::string(), dir);
}

bool Vocabulary::dir_has_tiktoken(const std::string& dir) { return is_file((fs::path(dir) / "tiktoken.model").string()); }
bool Vocabulary::dir_has_byte_tokenizer(const std::string& dir) {
  return is_file((fs::path(dir) / "tokenizer.json").string());
}

Vocabulary Vocabulary::load_dir(const std::string& dir) {
  if (dir_has_tiktoken(dir)) return load_tiktoken_dir(dir);
  const std::string bt = (fs::path(dir) / "tokenizer.json").string();
  if (is_file(bt)) return Vocabulary(ByteTokenizer::load(bt), bt);
  fail_input(dir, "", "has no tokenizer: neither tiktoken.model (+ tokenizer_config.json) nor tokenizer.json");
}

void Vocabulary::fill_token_bytes() {
  token_bytes_.assign(size_t(tik_->vocab_size()), 0);
  for (int32_t id = 0; id < tik_->base_size(); ++id) token_bytes_[size_t(id)] = int32_t(tik_->token_bytes(id).size());
}

std::string Vocabulary::describe() const {
  if (bytes_)
    return "byte tokenizer" + (source_.empty() ? std::string() : " " + source_) + " (" + std::to_string(vocab_size()) +
           " ids)";
  return "tiktoken vocabulary " + source_ + " (" + std::to_string(vocab_size()) + " ids: " +
         std::to_string(tik_->base_size()) + " base + " + std::to_string(tik_->specials().size()) + " special)";
}

std::vector<int32_t> Vocabulary::encode(std::string_view text) const {
  if (bytes_) return bytes_->encode(std::string(text));
  return tik_->encode(text, false);
}

std::vector<std::vector<int32_t>> Vocabulary::encode_batch(const std::vector<std::string_view>& docs) const {
  if (!bytes_) return tik_->encode_batch(docs);
  std::vector<std::vector<int32_t>> out;
  out.reserve(docs.size());
  for (std::string_view d : docs) out.push_back(encode(d));
  return out;
}

std::string Vocabulary::decode_bytes(const std::vector<int32_t>& ids) const { return tik_->decode_bytes(ids); }

void Vocabulary::save(const std::string& dir) const {
  make_directories(dir);
  if (bytes_) {
    bytes_->save((fs::path(dir) / "tokenizer.json").string());
    return;
  }
  write_text_file_atomic((fs::path(dir) / "tiktoken.model").string(), model_text_);
  write_text_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), config_text_);
}

std::string Vocabulary::identity() const {
  if (bytes_) return "bytes\n" + bytes_->to_json();
  return "tiktoken\n" + std::to_string(model_text_.size()) + "\n" + model_text_ + config_text_;
}

}  // namespace k3
