// Streaming decode: characters split across tokens are held back (never U+FFFD
// mid-stream), bytes that can never become valid come out as U+FFFD at once, flush() ends
// an incomplete tail with U+FFFD, and all outputs together equal a full decode.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "io/stream_decoder.h"
#include "io/utf8.h"

using namespace k3;

namespace {

Tiktoken byte_tokenizer() {
  BpeRanks r;
  for (int b = 0; b < 256; ++b) {
    char c = char(b);
    r.add(std::string_view(&c, 1));
  }
  r.add("\xE4\xB8");  // a token ending inside 中 (E4 B8 AD)
  return Tiktoken(std::move(r), k3_special_tokens(257), PatternKind::kimi);
}

}  // namespace

TEST(StreamDecoder, HoldsBackPartialCharacters) {
  Tiktoken tok = byte_tokenizer();
  StreamDecoder d(tok);
  const std::string emoji = "\xF0\x9F\x98\x80";
  EXPECT_EQ(d.push('a'), "a");
  for (int k = 0; k < 3; ++k) EXPECT_EQ(d.push(uint8_t(emoji[k])), "") << k;
  EXPECT_EQ(d.pending_bytes(), 3u);
  EXPECT_EQ(d.push(uint8_t(emoji[3])), emoji);
  EXPECT_EQ(d.push(256), "");  // E4 B8
  EXPECT_EQ(d.push(0xAD), "\xE4\xB8\xAD");
  EXPECT_EQ(d.push(tok.special_id("<|end_of_msg|>")), "<|end_of_msg|>");
  EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, ReplacesOnlyTrulyInvalidBytes) {
  Tiktoken tok = byte_tokenizer();
  StreamDecoder d(tok);
  EXPECT_EQ(d.push(0xFF), "\xEF\xBF\xBD");            // never valid: at once
  EXPECT_EQ(d.push(0xE2), "");                        // may still complete
  EXPECT_EQ(d.push('x'), "\xEF\xBF\xBDx");            // it did not
  EXPECT_EQ(d.push(0xED), "");
  EXPECT_EQ(d.push(0xA0), "\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: ED, then A0, invalid
  EXPECT_EQ(d.push(std::vector<int32_t>{0xE4, 0xBD}), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");               // incomplete at the end
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_THROW(d.push(tok.vocab_size()), Error);
}

TEST(StreamDecoder, ConcatenationEqualsFullDecode) {
  Tiktoken tok = byte_tokenizer();
  std::mt19937 rng(3);
  const std::string sample = "héllo 中文 😀 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB";
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids;
    const int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      // Mostly bytes of valid text, sometimes arbitrary bytes or the split token.
      const unsigned r = rng() % 10;
      ids.push_back(r < 6 ? int32_t(uint8_t(sample[rng() % sample.size()])) : r < 9 ? int32_t(rng() % 256) : 256);
    }
    StreamDecoder d(tok);
    std::string out;
    for (int32_t id : ids) {
      std::string piece = d.push(id);
      EXPECT_EQ(utf8::valid_prefix(piece), piece.size());
      out += piece;
    }
    out += d.flush();
    ASSERT_EQ(out, tok.decode(ids));
  }
}
