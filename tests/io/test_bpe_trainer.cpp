// BPE training: the incremental trainer gives exactly the merges of a plain trainer that
// recounts every pair before each merge; byte tokens come first; the written directory
// loads with K3's special layout after the base vocabulary; training text round-trips.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/cli_run.h"
#include "core/error.h"
#include "io/bpe_trainer.h"
#include "io/tiktoken.h"

using namespace k3;

namespace {

// Recount-everything BPE over the same pieces, same tie rule (highest count, then the
// smaller (left, right) ids), same reuse of an existing token for a repeated spelling.
std::vector<std::string> plain_train(const std::string& text, PatternKind kind, int32_t base_vocab) {
  std::map<std::string, int64_t> pieces;
  for (auto v : Pretokenizer(kind).split(text)) ++pieces[std::string(v)];
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (auto& [p, c] : pieces) {
    std::vector<int32_t> s;
    for (unsigned char ch : p) s.push_back(ch);
    words.push_back({s, c});
  }
  std::vector<std::string> tok;
  for (int b = 0; b < 256; ++b) tok.push_back(std::string(1, char(b)));
  while (int32_t(tok.size()) < base_vocab) {
    std::map<std::pair<int32_t, int32_t>, int64_t> counts;
    for (auto& [s, c] : words)
      for (size_t i = 0; i + 1 < s.size(); ++i) counts[{s[i], s[i + 1]}] += c;
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t bc = 0;
    for (auto& [p, c] : counts)
      if (c > bc) { bc = c; best = p; }  // map order: ties keep the smaller pair
    if (bc < 2) break;
    const std::string m = tok[best.first] + tok[best.second];
    int32_t id = int32_t(std::find(tok.begin(), tok.end(), m) - tok.begin());
    if (id == int32_t(tok.size())) tok.push_back(m);
    for (auto& [s, c] : words) {
      std::vector<int32_t> t;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == best.first && s[i + 1] == best.second) { t.push_back(id); ++i; }
        else t.push_back(s[i]);
      }
      s = t;
    }
  }
  return tok;
}

std::string sample_text(int words) {
  std::mt19937 rng(11);
  const char* vocab[] = {"the", "then", "there", "and", "getUserName", "中文", "12345", "aaaa", "don't", "Öl", "  ", "\n"};
  std::string s;
  for (int i = 0; i < words; ++i) {
    s += vocab[rng() % 12];
    s += rng() % 3 ? " " : "";
  }
  return s;
}

}  // namespace

TEST(BpeTrainer, EqualsRecountingTrainer) {
  const std::string text = sample_text(3000);
  for (PatternKind kind : {PatternKind::kimi, PatternKind::cl100k}) {
    BpeTrainOptions opt;
    opt.base_vocab = 330;
    opt.pattern = kind;
    BpeTrainResult r = train_bpe(text, opt);
    const auto want = plain_train(text, kind, 330);
    ASSERT_EQ(r.ranks.size(), int32_t(want.size())) << pattern_kind_name(kind);
    for (int32_t i = 0; i < r.ranks.size(); ++i) ASSERT_EQ(std::string(r.ranks.bytes(i)), want[i]) << i;
    EXPECT_GT(r.merges, 20);
  }
}

TEST(BpeTrainer, EqualsRecountingTrainerOnRepetitiveWords) {
  // Back-to-back occurrences of a pair ("aaaa", "abab") and long words, where the
  // incremental update must take `prev` from the rewritten word.
  std::string text;
  std::mt19937 rng(5);
  for (int i = 0; i < 400; ++i) {
    const int len = 1 + int(rng() % 40);
    const char* alphabet = i % 3 == 0 ? "a" : i % 3 == 1 ? "ab" : "abc";
    const int k = i % 3 + 1;
    text += ' ';
    for (int j = 0; j < len; ++j) text += alphabet[(i % 2 ? j : rng()) % k];
  }
  text += " " + std::string(3000, 'a') + " " + std::string(2001, 'b');
  BpeTrainOptions opt;
  opt.base_vocab = 360;
  BpeTrainResult r = train_bpe(text, opt);
  const auto want = plain_train(text, PatternKind::kimi, 360);
  ASSERT_EQ(r.ranks.size(), int32_t(want.size()));
  for (int32_t i = 0; i < r.ranks.size(); ++i) ASSERT_EQ(std::string(r.ranks.bytes(i)), want[i]) << i;
}

TEST(BpeTrainer, StopsWhenNoPairRepeats) {
  BpeTrainOptions opt;
  opt.base_vocab = 10000;
  BpeTrainResult r = train_bpe("abab cdcd", opt);
  EXPECT_TRUE(r.exhausted);
  EXPECT_LT(r.ranks.size(), 270);
  BpeTrainOptions small;
  small.base_vocab = 100;
  EXPECT_THROW(train_bpe("x", small), Error);
}

TEST(BpeTrainer, WritesALoadableK3Tokenizer) {
  const std::string text = sample_text(5000);
  BpeTrainOptions opt;
  opt.base_vocab = 300;
  int reports = 0;
  opt.progress = [&](const BpeTrainProgress& p) { ++reports; EXPECT_LE(p.merges_done, p.merges_target); };
  BpeTrainResult r = train_bpe(text, opt);
  EXPECT_GE(reports, 1);
  test::TempDir dir("k3_bpe_train");
  write_tokenizer_dir(dir.sub("tok"), r.ranks);
  Tiktoken t = Tiktoken::load(dir.sub("tok"));
  const int32_t base = r.ranks.size();
  EXPECT_EQ(t.base_size(), base);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(t.token_bytes(b), std::string(1, char(b)));
  EXPECT_EQ(t.special_id("[BOS]"), base);
  EXPECT_EQ(t.special_id("[EOS]"), base + 1);
  EXPECT_EQ(t.special_id("<|end_of_msg|>"), base + 2);
  EXPECT_EQ(t.special_id("<|open|>"), base + 3);
  EXPECT_EQ(t.special_id("<|close|>"), base + 4);
  EXPECT_EQ(t.special_id("<|sep|>"), base + 5);
  EXPECT_EQ(t.special_id("<|media_begin|>"), base + 18);
  EXPECT_EQ(t.special_id("<|media_pad|>"), base + 21);
  EXPECT_EQ(t.special_id("[UNK]"), base + 254);
  EXPECT_EQ(t.special_id("[PAD]"), base + 255);
  EXPECT_EQ(t.special_id("<|reserved_token_" + std::to_string(base + 6) + "|>"), base + 6);
  EXPECT_FALSE(t.specials()[3].special);
  EXPECT_TRUE(t.specials()[2].special);
  const auto ids = t.encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);  // the merges compress the training text
  EXPECT_EQ(t.decode(ids), text);
  // No temporary files are left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.sub("tok"))) (void)e, ++files;
  EXPECT_EQ(files, 2);
}
