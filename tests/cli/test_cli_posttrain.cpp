// `k3cpp sft`, `rl`, `distill` and `arith-corpus` as the built binary: help, bad options and bad
// configs are one line naming the option, file or field with a non-zero exit; the corpus
// command writes form-feed separated documents.
#include <gtest/gtest.h>

#include <fstream>

#include "common/cli_run.h"

using namespace k3::test;

TEST(CliPosttrain, HelpAndBadInput) {
  for (const char* c : {"sft", "rl", "distill", "arith-corpus"}) {
    const RunResult h = run_k3cpp(std::string(c) + " --help");
    EXPECT_EQ(h.rc, 0) << c;
    EXPECT_NE(h.out.find("usage: k3cpp"), std::string::npos) << c;
  }
  RunResult r = run_k3cpp("sft --out /tmp/x");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--config is required"), std::string::npos) << r.err;
  r = run_k3cpp("rl --config /nonexistent/rl.json --out /tmp/x");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("/nonexistent/rl.json"), std::string::npos) << r.err;
  TempDir d("k3_cli_posttrain");
  std::ofstream(d.sub("rl.json")) << R"({"model": "m", "arithmetic": {"ops": "-"}})";
  r = run_k3cpp("rl --config " + shell_quote(d.sub("rl.json")) + " --out " + shell_quote(d.sub("o")));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("arithmetic.ops"), std::string::npos) << r.err;
  r = run_k3cpp("sft --config " + shell_quote(d.sub("rl.json")) + " --bogus 1");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--bogus"), std::string::npos) << r.err;
}

TEST(CliPosttrain, ArithCorpus) {
  TempDir d("k3_cli_arith");
  const RunResult r = run_k3cpp("arith-corpus --out " + shell_quote(d.sub("c.txt")) + " --problems 20 --per-doc 5 --digits 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string text = slurp(d.sub("c.txt"));
  size_t docs = 1;
  for (char ch : text) docs += ch == '\f';
  EXPECT_EQ(docs, 4u);
  EXPECT_NE(text.find("write"), std::string::npos);  // the worked traces
  EXPECT_NE(run_k3cpp("arith-corpus --out " + shell_quote(d.sub("c.txt")) + " --digits 0").rc, 0);
}
