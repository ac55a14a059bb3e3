// `k3cpp tokenizer train`, `k3cpp tokenize` and `k3cpp detokenize` as the built binary: a
// trained directory round-trips text through the ids; --help works; bad vocabularies, ids
// and options fail with exit 1 and one line naming the file and line or field.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "common/cli_run.h"
#include "io/tiktoken.h"

using namespace k3;
using test::run_k3cpp;
using test::shell_quote;

namespace {

int count_lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST(CliTokenizer, TrainTokenizeDetokenizeRoundTrip) {
  test::TempDir dir("k3_cli_tok");
  std::string corpus;
  for (int i = 0; i < 400; ++i)
    corpus += "In the beginning God created the heaven and the earth. getUserName(" + std::to_string(i) + ") 中文。\n";
  std::ofstream(dir.sub("corpus.txt"), std::ios::binary) << corpus;
  auto tr = run_k3cpp("tokenizer train --corpus " + shell_quote(dir.sub("corpus.txt")) +
                      " --vocab-size 700 --out " + shell_quote(dir.sub("tok")));
  ASSERT_EQ(tr.rc, 0) << tr.err;
  EXPECT_NE(tr.out.find("base tokens + 256 special ids"), std::string::npos) << tr.out;
  EXPECT_NE(tr.err.find("merges"), std::string::npos) << tr.err;  // progress

  const Tiktoken tok = Tiktoken::load(dir.sub("tok"));
  const std::string text = "In the beginning: getUserName(7) <|open|> 中文";
  auto t = run_k3cpp("tokenize --vocab " + shell_quote(dir.sub("tok")) + " --text " + shell_quote(text));
  ASSERT_EQ(t.rc, 0) << t.err;
  std::string want;
  for (int32_t id : tok.encode(text)) {
    if (!want.empty()) want += ',';
    want += std::to_string(id);
  }
  EXPECT_EQ(t.out, want + "\n");
  auto d = run_k3cpp("detokenize --vocab " + shell_quote(dir.sub("tok")) + " --ids " + t.out.substr(0, t.out.size() - 1));
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_EQ(d.out, text);

  // --allow-special turns the name into its id; --file and --ids-out / --ids-file agree.
  auto s = run_k3cpp("tokenize --vocab " + shell_quote(dir.sub("tok")) + " --allow-special --text '<|open|>x'");
  ASSERT_EQ(s.rc, 0) << s.err;
  EXPECT_EQ(s.out.substr(0, s.out.find(',')), std::to_string(tok.special_id("<|open|>")));
  std::ofstream(dir.sub("in.txt"), std::ios::binary) << text;
  auto f = run_k3cpp("tokenize --vocab " + shell_quote(dir.sub("tok")) + " --file " + shell_quote(dir.sub("in.txt")) +
                     " --ids-out " + shell_quote(dir.sub("ids.txt")));
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_EQ(test::slurp(dir.sub("ids.txt")), want + "\n");
  auto g = run_k3cpp("detokenize --vocab " + shell_quote(dir.sub("tok")) + " --ids-file " + shell_quote(dir.sub("ids.txt")));
  EXPECT_EQ(g.out, text);
}

TEST(CliTokenizer, HelpAndErrors) {
  for (const char* cmd : {"tokenize", "detokenize", "tokenizer"}) {
    auto h = run_k3cpp(std::string(cmd) + " --help");
    EXPECT_EQ(h.rc, 0) << cmd;
    EXPECT_NE(h.out.find("usage: k3cpp"), std::string::npos) << cmd;
  }
  test::TempDir dir("k3_cli_tok_err");
  std::string model;
  for (int b = 0; b < 256; ++b) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    model += std::string{a[b >> 2], a[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  std::ofstream(dir.sub("good.model")) << model;
  std::ofstream(dir.sub("bad.model")) << model << "@@@@ 256\n";
  auto one_line = [](const test::RunResult& r) { return r.rc == 1 && count_lines(r.err) == 1; };

  auto r = run_k3cpp("tokenize --vocab " + shell_quote(dir.sub("bad.model")) + " --text hi");
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find(dir.sub("bad.model") + ": line 257: bad base64"), std::string::npos) << r.err;
  r = run_k3cpp("tokenize --vocab " + shell_quote(dir.sub("good.model")) + " --text hi --pattern gpt9");
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find("unknown pattern 'gpt9'"), std::string::npos) << r.err;
  r = run_k3cpp("tokenize --vocab " + shell_quote(dir.sub("good.model")));
  EXPECT_TRUE(one_line(r)) << r.err;
  r = run_k3cpp("detokenize --vocab " + shell_quote(dir.sub("good.model")) + " --ids 1,2,x");
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find("--ids: field 3: 'x' is not a token id"), std::string::npos) << r.err;
  r = run_k3cpp("detokenize --vocab " + shell_quote(dir.sub("good.model")) + " --ids 1,999");
  EXPECT_NE(r.err.find("--ids: field 2: token id 999 is outside the vocabulary (0..511)"), std::string::npos) << r.err;
  std::ofstream(dir.sub("ids.txt")) << "1,2\n3,-4\n";
  r = run_k3cpp("detokenize --vocab " + shell_quote(dir.sub("good.model")) + " --ids-file " + shell_quote(dir.sub("ids.txt")));
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find(dir.sub("ids.txt") + ": line 2: field 2: token id -4 is outside"), std::string::npos) << r.err;
  r = run_k3cpp("tokenizer train --corpus " + shell_quote(dir.sub("nope.txt")) + " --vocab-size 600 --out " + shell_quote(dir.sub("o")));
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find("nope.txt"), std::string::npos) << r.err;
  r = run_k3cpp("tokenizer train --corpus " + shell_quote(dir.sub("ids.txt")) + " --vocab-size 300 --out " + shell_quote(dir.sub("o")));
  EXPECT_NE(r.err.find("--vocab-size: 300 is out of range"), std::string::npos) << r.err;
}
