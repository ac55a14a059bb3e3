// `k3cpp train`, run as the built binary (K3_CLI_PATH):
//  - configs/train-tiny.json runs end to end on the default corpus (the King James Bible of
//    Debian's bible-kjv) with the default tokenizer (a vocabulary the run learns, 1024 ids):
//    exit 0, samples and the summary on stdout, held-out bits per byte at the last stage far
//    below the corpus's unigram baseline, metrics.jsonl records, OUT/tokenizer, and a
//    complete checkpoint with tiktoken.model that `k3cpp generate --prompt` encodes with
//    (fewer tokens than bytes) and `k3cpp eval` reads; --resume of the finished run says so;
//  - a short run with "tokenizer": "bytes" and the same with a trained vocabulary: the same
//    unigram baseline, both held-out bits per byte below it (per byte of the same text);
//  - --steps stops early (checkpoint, "continue with --resume") and --resume continues;
//  - bad invocations (no --config, a missing run file, a bad --steps, a new run into an
//    output directory that holds a checkpoint) fail with a non-zero exit and the culprit named.
#include <gtest/gtest.h>

#include "common/cli_run.h"
#include <stdlib.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "io/vocabulary.h"

namespace fs = std::filesystem;

namespace {

using k3::test::RunResult;
using k3::test::slurp;
struct TrainTempDir : k3::test::TempDir {
  TrainTempDir() : k3::test::TempDir("k3_cli_train") {}
};
using k3::test::q;
using k3::test::k3cpp;

using k3::test::has;
std::string tiny_run() { return q(std::string(K3_SOURCE_DIR) + "/configs/train-tiny.json"); }

}  // namespace

TEST(CliTrain, TrainTinyEndToEnd) {
  TrainTempDir t;
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

  for (const char* f : {"model.safetensors", "config.json", "tiktoken.model", "tokenizer_config.json",
                        "train_state.safetensors", "run.json"})
    EXPECT_TRUE(fs::exists(out + "/checkpoint/" + f)) << f;
  EXPECT_FALSE(fs::exists(out + "/checkpoint/tokenizer.json"));
  EXPECT_EQ(slurp(out + "/tokenizer/tiktoken.model"), slurp(out + "/checkpoint/tiktoken.model"));
  EXPECT_TRUE(has(r.err, "train: vocabulary of 1024 ids")) << r.err;
  // generate --prompt encodes with the checkpoint's vocabulary: "And God said" is 3 tokens, not 12 bytes.
  const k3::Vocabulary v = k3::Vocabulary::load_dir(out + "/checkpoint");
  ASSERT_FALSE(v.is_bytes());
  const size_t n_prompt = v.encode("And God said").size();
  EXPECT_LT(n_prompt, 6u);
  const RunResult g = k3cpp("generate " + q(out + "/checkpoint") + " --prompt 'And God said' --max-tokens 8");
  EXPECT_EQ(g.rc, 0) << g.err;
  EXPECT_TRUE(has(g.err, "tokenizer: tiktoken vocabulary")) << g.err;
  EXPECT_TRUE(has(g.err, "prefill " + std::to_string(n_prompt) + " tokens")) << g.err;
  EXPECT_FALSE(g.out.empty());
  // eval reads the checkpoint's run.json and vocabulary: the held-out figures of the last stage.
  const RunResult e = k3cpp("eval " + q(out + "/checkpoint") + " --max-tokens 8192 --json " + q(t.sub("eval.json")));
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_TRUE(has(e.err, "eval: tokenizer: tiktoken vocabulary")) << e.err;
  const auto ej = nlohmann::json::parse(slurp(t.sub("eval.json")));
  EXPECT_NEAR(ej["bpb"].get<double>(), last_bpb, 1e-4 * last_bpb);
  EXPECT_GT(ej["bytes"].get<int64_t>(), 2 * ej["targets"].get<int64_t>());

  const RunResult again = k3cpp("train --config " + tiny_run() + " --out " + q(out) + " --resume --quiet");
  EXPECT_EQ(again.rc, 0) << again.err;
  EXPECT_TRUE(has(again.out, "summary (complete, 30/30 steps")) << again.out;

  const RunResult fresh = k3cpp("train --config " + tiny_run() + " --out " + q(out));
  EXPECT_NE(fresh.rc, 0);
  EXPECT_TRUE(has(fresh.err, "--resume")) << fresh.err;
}

// The same run (10 steps) with the byte tokenizer and with a trained vocabulary: the first
// checkpoint holds tokenizer.json and generate encodes bytes with it; bits per byte of both
// runs are per byte of the same held-out text.
TEST(CliTrain, BytesTokenizerRunIsOnTheSameScale) {
  TrainTempDir t;
  auto run = nlohmann::json::parse(slurp(std::string(K3_SOURCE_DIR) + "/configs/train-tiny.json"));
  run["tokenizer"] = "bytes";
  run["model"] = std::string(K3_SOURCE_DIR) + "/configs/train-tiny-model.json";
  run["stages"] = nlohmann::json::parse(R"([{"name": "short", "seq_len": 64, "tokens": 20480, "lr_peak": 0.01, "warmup_steps": 4}])");
  run["samples"] = nlohmann::json::array();
  std::ofstream(t.sub("bytes.json")) << run.dump(2);
  run["tokenizer"] = "train";
  std::ofstream(t.sub("tik.json")) << run.dump(2);
  // (final held-out bits per byte, the unigram baseline of the start record)
  auto figures = [&](const std::string& dir) {
    double bpb = 0, unigram = 0;
    std::istringstream in(slurp(dir + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "eval" && j["stage_end"] == true) bpb = j["bpb"];
      if (j["type"] == "start") unigram = j["unigram_bpb"];
    }
    return std::make_pair(bpb, unigram);
  };
  const RunResult b = k3cpp("train --config " + q(t.sub("bytes.json")) + " --out " + q(t.sub("b")) + " --quiet");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_TRUE(fs::exists(t.sub("b/checkpoint/tokenizer.json")));
  EXPECT_FALSE(fs::exists(t.sub("b/checkpoint/tiktoken.model")));
  EXPECT_FALSE(fs::exists(t.sub("b/tokenizer")));
  const RunResult k = k3cpp("train --config " + q(t.sub("tik.json")) + " --out " + q(t.sub("k")) + " --quiet");
  ASSERT_EQ(k.rc, 0) << k.err;
  const auto [bb, ub] = figures(t.sub("b"));
  const auto [bk, uk] = figures(t.sub("k"));
  // The baseline is the corpus's bytes under either vocabulary; both runs beat it per byte
  // (bits per token of the trained vocabulary, ~2.6 bytes each, would be far above it), and
  // in the same steps the trained vocabulary, seeing ~2.6 times the text, is ahead.
  EXPECT_NEAR(ub, uk, 1e-6);
  EXPECT_GT(ub, 4.0);
  EXPECT_LT(bb, ub) << "bytes";
  EXPECT_LT(bk, ub) << "trained vocabulary";
  EXPECT_LT(bk, bb);
  const RunResult g = k3cpp("generate " + q(t.sub("b/checkpoint")) + " --prompt 'And God' --max-tokens 4");
  EXPECT_EQ(g.rc, 0) << g.err;
  EXPECT_TRUE(has(g.err, "tokenizer: byte tokenizer")) << g.err;
  EXPECT_TRUE(has(g.err, "prefill 7 tokens")) << g.err;
}

TEST(CliTrain, StepsStopsAndResumeContinues) {
  TrainTempDir t;
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
  TrainTempDir t;
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
  // The vocabulary: a missing tiktoken directory, a model config too small for the one asked for.
  auto run = nlohmann::json::parse(slurp(std::string(K3_SOURCE_DIR) + "/configs/train-tiny.json"));
  run["model"] = std::string(K3_SOURCE_DIR) + "/configs/train-tiny-model.json";
  run["tokenizer"] = {{"kind", "tiktoken"}, {"dir", "no-such-vocab"}};
  std::ofstream(t.sub("r1.json")) << run.dump();
  r = k3cpp("train --config " + q(t.sub("r1.json")) + " --out " + q(t.sub("x1")));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, t.sub("no-such-vocab"))) << r.err;
  run["tokenizer"] = {{"kind", "train"}, {"vocab_size", 4096}};
  std::ofstream(t.sub("r2.json")) << run.dump();
  r = k3cpp("train --config " + q(t.sub("r2.json")) + " --out " + q(t.sub("x2")));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "train-tiny-model.json: vocab_size: 1024") && has(r.err, "tokenizer.vocab_size")) << r.err;
  EXPECT_FALSE(fs::exists(t.sub("x2/tokenizer")));
  r = k3cpp("train --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(has(r.out, "--resume")) << r.out;
}
