#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/tokenizer.h"

using namespace k3;
namespace fs = std::filesystem;

TEST(ByteTokenizer, RoundTripsBytesAndSpecials) {
  ByteTokenizer t;
  std::string text = "In the beginning\n\xff\x00z";
  text.push_back('\0');
  auto ids = t.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.vocab_size(), 260);
  EXPECT_EQ(t.decode_one(t.eos()), "<|eos|>");
}

TEST(ByteTokenizer, SavesLoadsAndRefusesForeignTokenizers) {
  fs::path dir = fs::temp_directory_path() / ("k3tok-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ByteTokenizer t;
  t.save((dir / "tokenizer.json").string());
  ByteTokenizer u = ByteTokenizer::load((dir / "tokenizer.json").string());
  EXPECT_EQ(u.specials(), t.specials());
  std::ofstream((dir / "hf.json").string()) << R"({"type": "tiktoken", "special_tokens": {}})";
  try {
    ByteTokenizer::load((dir / "hf.json").string());
    FAIL() << "foreign tokenizer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hf.json: type"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ByteTokenizer::load((dir / "missing.json").string()), Error);
  fs::remove_all(dir);
}
