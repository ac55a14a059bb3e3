// Bad tokenizer files are refused with one k3::Error naming the file and the line or
// field: malformed lines, bad base64, duplicate ranks, gaps, duplicate token bytes, a
// missing file or directory entry, and configs whose special tokens collide with base
// ranks, fall outside the reserved ids, repeat a name or are not valid JSON.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <vector>
#include <string>

#include "common/cli_run.h"
#include "core/error.h"
#include "io/tiktoken.h"
#include "io/tiktoken_file.h"

using namespace k3;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A valid three-token model: "a" 0, "b" 1, "ab" 2.
const char* kGood = "YQ== 0\nYg== 1\nYWI= 2\n";

}  // namespace

TEST(TiktokenFile, Base64RoundTripsAndRefusesBadText) {
  std::string out;
  for (const std::string& s : std::vector<std::string>{"a", "ab", "abc", "abcd", std::string("\0\xff\x80", 3)}) {
    ASSERT_TRUE(base64_decode(base64_encode(s), out));
    EXPECT_EQ(out, s);
  }
  for (const char* bad : {"", "Y", "YQ=", "YQ=A", "Y===", "YR==", "Y!==", "YQ==YQ=="})
    EXPECT_FALSE(base64_decode(bad, out)) << bad;
}

TEST(TiktokenFile, ParsesAValidModel) {
  BpeRanks r = parse_tiktoken_model(kGood, "m");
  ASSERT_EQ(r.size(), 3);
  EXPECT_EQ(r.bytes(2), "ab");
  EXPECT_EQ(r.find("b"), 1);
  // Lines in any order, blank lines and CRLF are accepted.
  EXPECT_EQ(parse_tiktoken_model("YWI= 2\r\n\nYQ== 0\nYg== 1", "m").find("ab"), 2);
  EXPECT_EQ(format_tiktoken_model(r), kGood);
}

TEST(TiktokenFile, RefusesMalformedModelsNamingTheLine) {
  auto err = [](const char* text) { return error_of([&] { parse_tiktoken_model(text, "/v/tiktoken.model"); }); };
  EXPECT_EQ(err("YQ== 0\nYg== 1\nY!I= 2\n"), "/v/tiktoken.model: line 3: bad base64 'Y!I='");
  EXPECT_EQ(err("YQ== 0\nYg== 0\n"), "/v/tiktoken.model: line 2: duplicate rank 0 (also on line 1)");
  EXPECT_EQ(err("YQ== 0\nYg== 2\n"),
            "/v/tiktoken.model: line 2: rank 2 leaves a gap: rank 1 is missing (ranks must be 0..N-1)");
  EXPECT_EQ(err("YQ== 0\nYQ== 1\n"),
            "/v/tiktoken.model: line 2: duplicate token bytes (rank 1 repeats rank 0 from line 1)");
  EXPECT_EQ(err("YQ== 0\nYg==\n"), "/v/tiktoken.model: line 2: expected '<base64> <rank>'");
  EXPECT_EQ(err("YQ== 0 7\n"), "/v/tiktoken.model: line 1: expected '<base64> <rank>'");
  EXPECT_EQ(err("YQ== -1\n"), "/v/tiktoken.model: line 1: bad rank '-1'");
  EXPECT_EQ(err("YQ== 1x\n"), "/v/tiktoken.model: line 1: bad rank '1x'");
  EXPECT_EQ(err("\n\n"), "/v/tiktoken.model: contents: no tokens (empty vocabulary file)");
}

TEST(TiktokenFile, RefusesMissingFilesAndBadConfigs) {
  test::TempDir dir("k3_tok_err");
  EXPECT_NE(error_of([&] { Tiktoken::load(dir.sub("nope")); }).find(dir.sub("nope") + ": no such vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Tiktoken::load(dir.path); }).find("the directory has no tiktoken.model"), std::string::npos);
  std::ofstream(dir.sub("tiktoken.model")) << kGood;
  EXPECT_EQ(Tiktoken::load(dir.path).vocab_size(), 3 + 256);  // no config: all reserved
  const std::string cfg = dir.sub("tokenizer_config.json");
  auto with_config = [&](const std::string& json) {
    std::ofstream(cfg) << json;
    return error_of([&] { Tiktoken::load(dir.path); });
  };
  EXPECT_EQ(with_config(R"({"added_tokens_decoder": {"1": {"content": "<|x|>"}}})"),
            cfg + ": added_tokens_decoder.1: special token '<|x|>' collides with base rank 1 (the vocabulary has 3 base tokens)");
  EXPECT_EQ(with_config(R"({"added_tokens_decoder": {"259": {"content": "<|x|>"}}})"),
            cfg + ": added_tokens_decoder.259: id 259 is past the 256 special ids after the base vocabulary (3..258)");
  EXPECT_EQ(with_config(R"({"added_tokens_decoder": {"3": {"content": "<|x|>"}, "4": {"content": "<|x|>"}}})"),
            cfg + ": added_tokens_decoder.4: token name '<|x|>' is also used by added_tokens_decoder.3");
  EXPECT_EQ(with_config(R"({"added_tokens_decoder": {"x": {"content": "<|x|>"}}})"),
            cfg + ": added_tokens_decoder.x: the key must be a token id");
  EXPECT_EQ(with_config(R"({"added_tokens_decoder": {"3": {"content": 5}}})"),
            cfg + ": added_tokens_decoder.3: expected an object with a string \"content\"");
  EXPECT_EQ(with_config(R"({"added_tokens_decoder": {"3": {"content": "<|reserved_token_4|>"}}})"),
            cfg + ": added_tokens_decoder.3: token name '<|reserved_token_4|>' is the reserved name of id 4");
  EXPECT_NE(with_config("{not json").find(cfg + ": json: not valid JSON"), std::string::npos);
  // A good config names its ids; the rest stay reserved.
  std::ofstream(cfg) << R"({"added_tokens_decoder": {"3": {"content": "[BOS]", "special": true},
                            "6": {"content": "<|open|>", "special": false}}})";
  Tiktoken t = Tiktoken::load(dir.path);
  EXPECT_EQ(t.special_id("[BOS]"), 3);
  EXPECT_EQ(t.special_id("<|open|>"), 6);
  EXPECT_FALSE(t.specials()[3].special);
  EXPECT_EQ(t.special_id("<|reserved_token_4|>"), 4);
  // A broken model file inside a directory is named by its own path.
  std::ofstream(dir.sub("tiktoken.model")) << "YQ== 0\n%%%% 1\n";
  EXPECT_EQ(error_of([&] { Tiktoken::load(dir.path); }), dir.sub("tiktoken.model") + ": line 2: bad base64 '%%%%'");
}
