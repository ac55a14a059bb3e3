// `k3cpp train`, run as the built binary (K3_CLI_PATH):
//  - configs/train-tiny.json runs end to end on the default corpus (the King James Bible of
//    Debian's bible-kjv): exit 0, samples and the summary on stdout, held-out bits per byte
//    at the last stage far below the corpus's unigram baseline, metrics.jsonl records, a
//    complete checkpoint that `k3cpp generate` reads; --resume of the finished run says so;
//  - --steps stops early (checkpoint, "continue with --resume") and --resume continues;
//  - bad invocations (no --config, a missing run file, a bad --steps, a new run into an
//    output directory that holds a checkpoint) fail with a non-zero exit and the culprit named.
#include <gtest/gtest.h>

#include "common/cli_run.h"
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

using k3::test::RunResult;
using k3::test::slurp;
struct TempDir : k3::test::TempDir {
  TempDir() : k3::test::TempDir("k3_cli_train") {}
};
std::string q(const std::string& s) { return k3::test::shell_quote(s); }
RunResult k3cpp(const std::string& args) { return k3::test::run_k3cpp(args); }

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
std::string tiny_run() { return q(std::string(K3_SOURCE_DIR) + "/configs/train-tiny.json"); }

}  // namespace

TEST(CliTrain, TrainTinyEndToEnd) {
  TempDir t;
  const std::string out = t.sub("run");
  const RunResult r = k3cpp("train --config " + tiny_run() + " --out " + q(out));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "--- sample 1 ---")) << r.out;
  EXPECT_TRUE(has(r.out, "summary (complete")) << r.out;
  EXPECT_TRUE(has(r.out, "unigram baseline")) << r.out;
  EXPECT_TRUE(has(r.out, "held-out MaxVio per MoE layer")) << r.out;
  EXPECT_TRUE(has(r.err, "stage 2/2 'long'")) << r.err;  // the transition is logged

  // metrics.jsonl: the baseline, one step record per step, held-out evaluations.
  std::istringstream in(slurp(out + "/metrics.jsonl"));
  std::string line;
  double unigram = 0, last_bpb = 0;
  int steps = 0, stage_evals = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "start") unigram = j["unigram_bpb"];
    if (j["type"] == "step") {
      ++steps;
      EXPECT_TRUE(j.contains("tokens_per_s") && j.contains("grad_norm") && j.contains("maxvio") && j.contains("lr"));
    }
    if (j["type"] == "eval" && j["stage_end"] == true) ++stage_evals, last_bpb = j["bpb"];
  }
  EXPECT_EQ(steps, 30);
  EXPECT_EQ(stage_evals, 2);
  EXPECT_GT(unigram, 4.0);  // KJV bytes: about 4.4 bits
  EXPECT_LT(last_bpb, unigram - 1.0) << "held-out " << last_bpb << " bits/byte vs unigram " << unigram;

  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json", "train_state.safetensors", "run.json"})
    EXPECT_TRUE(fs::exists(out + "/checkpoint/" + f)) << f;
  const RunResult g = k3cpp("generate " + q(out + "/checkpoint") + " --prompt 'And God' --max-tokens 8");
  EXPECT_EQ(g.rc, 0) << g.err;
  EXPECT_TRUE(has(g.out, "And God") || !g.out.empty());

  const RunResult again = k3cpp("train --config " + tiny_run() + " --out " + q(out) + " --resume --quiet");
  EXPECT_EQ(again.rc, 0) << again.err;
  EXPECT_TRUE(has(again.out, "summary (complete, 30/30 steps")) << again.out;

  const RunResult fresh = k3cpp("train --config " + tiny_run() + " --out " + q(out));
  EXPECT_NE(fresh.rc, 0);
  EXPECT_TRUE(has(fresh.err, "--resume")) << fresh.err;
}

TEST(CliTrain, StepsStopsAndResumeContinues) {
  TempDir t;
  const std::string out = t.sub("run");
  const RunResult a = k3cpp("train --config " + tiny_run() + " --out " + q(out) + " --steps 3");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_TRUE(has(a.err, "stopped at step 3 of 30")) << a.err;
  EXPECT_TRUE(has(a.out, "summary (incomplete, 3/30 steps")) << a.out;
  EXPECT_FALSE(has(a.out, "--- sample")) << a.out;
  const RunResult b = k3cpp("train --config " + tiny_run() + " --out " + q(out) + " --steps 5 --resume");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_TRUE(has(b.err, "resumed")) << b.err;
  EXPECT_TRUE(has(b.out, "5/30 steps")) << b.out;
}

TEST(CliTrain, BadInvocationsNameTheCulprit) {
  TempDir t;
  RunResult r = k3cpp("train --out " + q(t.sub("x")));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--config")) << r.err;
  r = k3cpp("train --config " + q(t.sub("nope.json")) + " --out " + q(t.sub("x")));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "nope.json")) << r.err;
  r = k3cpp("train --config " + tiny_run() + " --out " + q(t.sub("x")) + " --steps -3");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--steps")) << r.err;
  r = k3cpp("train --config " + tiny_run() + " --out " + q(t.sub("x")) + " --resume");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "no checkpoint to resume")) << r.err;
  r = k3cpp("train --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(has(r.out, "--resume")) << r.out;
}
