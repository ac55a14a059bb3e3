#include "io/tiktoken.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/threads.h"
#include "io/long_text.h"
#include "io/tiktoken_file.h"
#include "io/utf8.h"

namespace k3 {

Tiktoken Tiktoken::load(const std::string& path, PatternKind pattern) {
  namespace fs = std::filesystem;
  std::string model = path, config;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    model = (fs::path(path) / "tiktoken.model").string();
    if (!fs::exists(model, ec)) fail_input(path, "tiktoken.model", "the directory has no tiktoken.model");
    std::string c = (fs::path(path) / "tokenizer_config.json").string();
    if (fs::exists(c, ec)) config = c;
  } else if (!fs::exists(path, ec)) {
    fail_input(path, "", "no such vocabulary file or directory");
  }
  BpeRanks ranks = read_tiktoken_model(model);
  std::vector<SpecialToken> specials = read_special_tokens(config, ranks.size());
  return Tiktoken(std::move(ranks), std::move(specials), pattern);
}

Tiktoken::Tiktoken(BpeRanks ranks, std::vector<SpecialToken> specials, PatternKind pattern)
    : ranks_(std::move(ranks)), specials_(std::move(specials)), pattern_(pattern), pretok_(pattern) {
  for (size_t k = 0; k < specials_.size(); ++k) {
    K3_ASSERT(specials_[k].id == base_size() + int32_t(k), "special ids must follow the base vocabulary");
    K3_ASSERT(special_ids_.emplace(specials_[k].name, specials_[k].id).second, "duplicate special name");
    special_lengths_.push_back(specials_[k].name.size());
    special_first_[static_cast<unsigned char>(specials_[k].name[0])] = true;
  }
  std::sort(special_lengths_.begin(), special_lengths_.end(), std::greater<>());
  special_lengths_.erase(std::unique(special_lengths_.begin(), special_lengths_.end()), special_lengths_.end());
}

int32_t Tiktoken::special_id(const std::string& name) const {
  auto it = special_ids_.find(name);
  if (it == special_ids_.end()) fail("tokenizer: no special token named '" + name + "'");
  return it->second;
}

void Tiktoken::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  auto run = [&](std::string_view part) {
    pretok_.split(part, [&](size_t b, size_t e) { ranks_.encode_piece(part.substr(b, e - b), out); });
  };
  if (pattern_ != PatternKind::kimi) {
    run(text);
    return;
  }
  for (auto [b, e] : split_long_text(text)) run(text.substr(b, e - b));
}

void Tiktoken::encode_append(std::string_view raw, bool allow_special, std::vector<int32_t>& out) const {
  const std::string clean = utf8::valid_prefix(raw) == raw.size() ? std::string() : utf8::sanitize(raw);
  const std::string_view text = clean.empty() ? raw : std::string_view(clean);
  if (!allow_special || specials_.empty()) {
    encode_ordinary(text, out);
    return;
  }
  // The long-input cut comes first in the reference (specials are found inside each piece),
  // so a special name split by a cut is text there too.
  auto with_specials = [&](std::string_view part) {
    size_t start = 0, i = 0;
    while (i < part.size()) {
      if (!special_first_[static_cast<unsigned char>(part[i])]) { ++i; continue; }
      int32_t id = -1;
      size_t len = 0;
      for (size_t l : special_lengths_) {
        if (l > part.size() - i) continue;
        auto it = special_ids_.find(std::string(part.substr(i, l)));
        if (it != special_ids_.end()) { id = it->second; len = l; break; }
      }
      if (id < 0) { ++i; continue; }
      pretok_.split(part.substr(start, i - start), [&](size_t b, size_t e) {
        ranks_.encode_piece(part.substr(start + b, e - b), out);
      });
      out.push_back(id);
      i += len;
      start = i;
    }
    pretok_.split(part.substr(start), [&](size_t b, size_t e) { ranks_.encode_piece(part.substr(start + b, e - b), out); });
  };
  if (pattern_ != PatternKind::kimi) {
    with_specials(text);
    return;
  }
  for (auto [b, e] : split_long_text(text)) with_specials(text.substr(b, e - b));
}

std::vector<int32_t> Tiktoken::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  encode_append(text, allow_special, out);
  return out;
}

std::vector<int32_t> Tiktoken::encode_segments(const std::vector<Segment>& segments) const {
  std::vector<int32_t> out;
  for (const auto& s : segments) encode_append(s.text, s.allow_special, out);
  return out;
}

std::vector<std::vector<int32_t>> Tiktoken::encode_batch(const std::vector<std::string_view>& docs, int threads) const {
  std::vector<std::vector<int32_t>> out(docs.size());
  if (threads <= 0) threads = num_threads();
  std::string first_error;
  // Dynamic schedule: documents differ widely in length.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (long long i = 0; i < (long long)docs.size(); ++i) {
    try {
      out[i] = encode(docs[i]);
    } catch (const Error& e) {
#pragma omp critical(k3_tiktoken_batch)
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!first_error.empty()) fail(first_error);
  return out;
}

std::string_view Tiktoken::token_bytes(int32_t id) const {
  if (id >= 0 && id < base_size()) return ranks_.bytes(id);
  if (is_special(id)) return specials_[id - base_size()].name;
  fail("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary (0.." +
       std::to_string(vocab_size() - 1) + ")");
}

std::string Tiktoken::decode_bytes(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::string Tiktoken::decode(const std::vector<int32_t>& ids) const { return utf8::sanitize(decode_bytes(ids)); }

}  // namespace k3
