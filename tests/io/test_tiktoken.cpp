// The tiktoken encoder's parts: the PCRE2 rewrite of the Kimi pattern (class intersections,
// White_Space) checked over every code point, the pattern's splits (case split, Han runs,
// digit groups, contractions), the pinned Unicode-version gap, the long-input rule, the
// byte-pair merge against a plain transcription of the reference loop, and segment-wise
// encoding with special tokens.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/long_text.h"
#include "io/pretokenizer.h"
#include "io/tiktoken.h"
#include "io/utf8.h"

using namespace k3;

namespace {

std::string all_code_points() {
  std::string s;
  for (char32_t c = 1; c < 0x110000; ++c)
    if (c < 0xD800 || c > 0xDFFF) utf8::append(s, c);
  return s;
}

// Byte offsets of every match of `pattern` over `text`.
std::vector<size_t> match_offsets(const std::string& pattern, const std::string& text) {
  std::vector<size_t> out;
  Pretokenizer p(pattern);
  p.split(text, [&](size_t b, size_t) { out.push_back(b); });
  return out;
}

std::vector<std::string> pieces(PatternKind k, const std::string& text) {
  std::vector<std::string> out;
  for (auto v : Pretokenizer(k).split(text)) out.emplace_back(v);
  return out;
}

using Pieces = std::vector<std::string>;

// All 256 bytes plus `extra` tokens, in that rank order.
BpeRanks byte_ranks(const std::vector<std::string>& extra = {}) {
  BpeRanks r;
  for (int b = 0; b < 256; ++b) {
    char c = char(b);
    r.add(std::string_view(&c, 1));
  }
  for (const auto& e : extra) EXPECT_TRUE(r.add(e)) << e;
  return r;
}

// tiktoken's _byte_pair_merge transcribed plainly: rescan all adjacent pairs each round,
// merge the lowest rank (leftmost on a tie).
std::vector<size_t> reference_merge(const BpeRanks& ranks, std::string_view piece) {
  std::vector<size_t> b(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) b[i] = i;
  for (;;) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 2 < b.size(); ++i) {
      int32_t r = ranks.find(piece.substr(b[i], b[i + 2] - b[i]));
      if (r >= 0 && (best < 0 || r < best)) { best = r; at = i; }
    }
    if (best < 0) break;
    b.erase(b.begin() + at + 1);
  }
  return b;
}

}  // namespace

TEST(Pretokenizer, IntersectionRewriteEqualsLookaheadFormOnEveryCodePoint) {
  const std::string all = all_code_points();
  const std::pair<const char*, const char*> forms[] = {
      {"[^\\p{Ll}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]", "(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"},
      {"[^\\p{Lu}\\p{Lt}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}\\p{sc:Han}]", "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"},
  };
  for (auto [mine, lookahead] : forms) {
    auto a = match_offsets(mine, all), b = match_offsets(lookahead, all);
    EXPECT_GT(a.size(), 30000u);  // letters and marks outside Han
    EXPECT_EQ(a, b) << mine;
  }
  // And the complement trick relies on the categories partitioning the code points.
  EXPECT_EQ(match_offsets("[^\\p{L}\\p{M}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{C}]", all).size(), 0u);
}

TEST(Pretokenizer, WhiteSpaceClassIsUnicodeWhiteSpace) {
  // The spelled-out \s must be White_Space: Python's isspace minus U+001C..U+001F, and not
  // U+180E (which PCRE2's own \s with UCP still matches).
  const std::string all = all_code_points();
  auto ws = match_offsets("[\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]", all);
  std::vector<size_t> py;
  for (size_t i = 0; i < all.size();) {
    size_t at = i;
    char32_t c = utf8::next(all, i);
    if (utf8::is_python_space(c) && !(c >= 0x1C && c <= 0x1F)) py.push_back(at);
  }
  EXPECT_EQ(ws, py);
  // With PCRE2's \s these would split as "\u180E" | "\u180Eab".
  EXPECT_EQ(pieces(PatternKind::kimi, "\u180E\u180Eab"), (Pieces{"\u180E\u180E", "ab"}));
  EXPECT_EQ(pieces(PatternKind::cl100k, "\u180E\u180Eab"), (Pieces{"\u180E\u180E", "ab"}));
}

TEST(Pretokenizer, KimiPatternSplits) {
  const auto K = PatternKind::kimi;
  EXPECT_EQ(pieces(K, "getUserName"), (Pieces{"get", "User", "Name"}));
  EXPECT_EQ(pieces(K, "HTTPServer parseJSON"), (Pieces{"HTTPServer", " parse", "JSON"}));
  EXPECT_EQ(pieces(K, "中文abc你好，世界"), (Pieces{"中文", "abc", "你好", "，", "世界"}));
  // Han is the Script property: CJK punctuation (Script_Extensions Han) is not in the run.
  EXPECT_EQ(pieces(K, "中文、\n「引」。"), (Pieces{"中文", "、\n", "「", "引", "」。"}));
  EXPECT_EQ(pieces(K, "1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(pieces(K, "I'M we'Re don't"), (Pieces{"I'M", " we'Re", " don't"}));
  EXPECT_EQ(pieces(K, "  hello\n\n\tx  "), (Pieces{" ", " hello", "\n\n", "\tx", "  "}));
  EXPECT_EQ(pieces(K, "a+=b;\r\n"), (Pieces{"a", "+=", "b", ";\r\n"}));
  EXPECT_EQ(pieces(K, "Ünïcödé ΑΒΓαβγ αβγΑΒΓ"), (Pieces{"Ünïcödé", " ΑΒΓαβγ", " αβγ", "ΑΒΓ"}));
  // cl100k does not split by case; o200k does, and keeps Han inside letter runs.
  EXPECT_EQ(pieces(PatternKind::cl100k, "getUserName"), (Pieces{"getUserName"}));
  EXPECT_EQ(pieces(PatternKind::o200k, "getUserName 中文abc"), (Pieces{"get", "User", "Name", " 中文abc"}));
}

TEST(Pretokenizer, PinsTheUnicodeVersionGap) {
  // PCRE2 10.42 has Unicode 14 tables: U+31350 (CJK extension H, Unicode 15) and U+2EBF0
  // (extension I, 15.1) are unassigned there, so not Han and not letters: they fall into
  // the punctuation-like alternative. The reference (Unicode 15+) keeps them in the Han run.
  // If this fails, PCRE2's tables changed: update docs/tokenizer.md and the oracle pin.
  EXPECT_EQ(pieces(PatternKind::kimi, "中\U00031350字"), (Pieces{"中", "\U00031350", "字"}));
  EXPECT_EQ(pieces(PatternKind::kimi, "中\U0002EBF0"), (Pieces{"中", "\U0002EBF0"}));
  EXPECT_EQ(pieces(PatternKind::kimi, "中\U0002A6DF"), (Pieces{"中\U0002A6DF"}));  // extension B: Unicode 3.1
}

TEST(LongText, SplitsRunsAndChunksLikeTheReference) {
  using R = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(split_long_text("aaaa  b", {10, 3}), (R{{0, 3}, {3, 7}}));
  EXPECT_EQ(split_long_text("abcdefghij", {4, 100}), (R{{0, 4}, {4, 8}, {8, 10}}));
  // Python's isspace: U+001C counts as whitespace, so it breaks the letter run.
  EXPECT_EQ(split_long_text("aaa\x1c" "aaa", {100, 3}), (R{{0, 7}}));
  EXPECT_EQ(split_long_text("aaaaaaa", {100, 3}), (R{{0, 3}, {3, 6}, {6, 7}}));
  // Limits count code points, not bytes.
  EXPECT_EQ(split_long_text("éééé", {100, 3}), (R{{0, 6}, {6, 8}}));
  EXPECT_TRUE(split_long_text("").empty());
  const std::string spaces = "x" + std::string(25001, ' ') + "y";
  EXPECT_EQ(split_long_text(spaces), (R{{0, 25001}, {25001, 25003}}));
}

TEST(BpeRanks, MergeMatchesTheReferenceLoop) {
  std::mt19937 rng(7);
  std::vector<std::string> extra;
  for (int k = 0; k < 400; ++k) {
    std::string t;
    const int len = 2 + int(rng() % 5);
    for (int i = 0; i < len; ++i) t.push_back("abc"[rng() % 3]);
    if (std::find(extra.begin(), extra.end(), t) == extra.end()) extra.push_back(t);
  }
  const BpeRanks ranks = byte_ranks(extra);
  for (int trial = 0; trial < 300; ++trial) {
    std::string piece;
    const int len = 1 + int(rng() % (trial < 150 ? 100 : 700));  // both the short and the heap path
    for (int i = 0; i < len; ++i) piece.push_back("abc"[rng() % 3]);
    ASSERT_EQ(ranks.merge_boundaries(piece), reference_merge(ranks, piece)) << piece;
  }
}

TEST(Tiktoken, EncodesDecodesAndKeepsSegmentsApart) {
  Tiktoken tok(byte_ranks({"ab", "abc", " a"}), k3_special_tokens(259), PatternKind::kimi);
  EXPECT_EQ(tok.base_size(), 259);
  EXPECT_EQ(tok.vocab_size(), 259 + 256);
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(tok.encode("abd"), (std::vector<int32_t>{256, 'd'}));
  // No merge across segments.
  EXPECT_EQ(tok.encode_segments({{"a", false}, {"bc", false}}), (std::vector<int32_t>{'a', 'b', 'c'}));
  const int32_t open = tok.special_id("<|open|>"), sep = tok.special_id("<|sep|>");
  EXPECT_EQ(open, 259 + 3);
  EXPECT_EQ(tok.special_id("[PAD]"), 259 + 255);
  EXPECT_EQ(tok.special_id("<|reserved_token_265|>"), 265);
  // A control segment yields special ids; the same text in a text segment stays text.
  auto ids = tok.encode_segments({{"<|open|>", true}, {"ab<|open|>x", false}, {"<|sep|>", true}});
  EXPECT_EQ(ids.front(), open);
  EXPECT_EQ(ids.back(), sep);
  for (size_t i = 1; i + 1 < ids.size(); ++i) EXPECT_LT(ids[i], tok.base_size());
  EXPECT_EQ(tok.decode(ids), "<|open|>ab<|open|>x<|sep|>");
  // Specials split the text for the pattern: "ab" before, "abc" after.
  EXPECT_EQ(tok.encode("ab<|sep|>abc", true), (std::vector<int32_t>{256, sep, 257}));
  // Invalid UTF-8 is encoded as U+FFFD, as the reference sees it.
  EXPECT_EQ(tok.decode(tok.encode("a\xff")), "a\xEF\xBF\xBD");
  EXPECT_THROW(tok.decode({tok.vocab_size()}), Error);
  EXPECT_THROW(tok.decode({-1}), Error);
}

TEST(Tiktoken, BatchEncodingEqualsOneByOne) {
  Tiktoken tok(byte_ranks({"th", "the", " the", "in"}), {}, PatternKind::kimi);
  std::vector<std::string> docs;
  for (int i = 0; i < 50; ++i) docs.push_back("in the beginning " + std::to_string(i) + std::string(i, 'x'));
  std::vector<std::string_view> views(docs.begin(), docs.end());
  auto batch = tok.encode_batch(views, 2);
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(batch[i], tok.encode(docs[i]));
}
