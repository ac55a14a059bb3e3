#include <gtest/gtest.h>

#include "core/error.h"
#include "train/run_config.h"

using namespace k3;

static std::string expect_error(const std::string& text) {
  try {
    parse_run_config(text, "/tmp/run.json");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

TEST(RunConfig, ParsesAndResolvesPaths) {
  RunConfig r = parse_run_config(R"({"model": "../configs/tiny.json", "stages": [
    {"name": "8k", "seq_len": 64, "tokens": 10000, "lr_peak": 0.01, "warmup_steps": 5},
    {"seq_len": 128, "tokens": 5000, "lr_peak": 0.01, "lr_end": 0.001, "decay_frac": 1.0}]})",
                                 "/x/runs/run.json");
  EXPECT_EQ(r.model_config, "/x/configs/tiny.json");
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].name, "8k");
  EXPECT_EQ(r.stages[1].name, "stage2");
  EXPECT_EQ(r.balancer, "qb-hist");
  RunConfig back = parse_run_config(run_config_to_json(r), "/y/run.json");
  EXPECT_EQ(back.stages[1].lr_end, 0.001);
}

TEST(RunConfig, RefusesBadFieldsNamingThem) {
  const std::string st = R"("stages": [{"seq_len": 64, "tokens": 100}])";
  EXPECT_NE(expect_error(R"({"stages": []})").find("/tmp/run.json: model"), std::string::npos);
  EXPECT_NE(expect_error(R"({"model": "m.json", "stages": []})").find("stages"), std::string::npos);
  EXPECT_NE(expect_error(R"({"model": "m.json", "balancer": "magic", )" + st + "}").find("balancer"), std::string::npos);
  EXPECT_NE(expect_error(R"({"model": "m.json", "lr": 1, )" + st + "}").find("lr: unknown field"), std::string::npos);
  EXPECT_NE(expect_error(R"({"model": "m.json", "batch_tokens": 3000, )" + st + "}").find("batch_tokens"), std::string::npos);
  EXPECT_NE(expect_error(R"({"model": "m.json", "stages": [{"seq_len": 64, "tokens": -5}]})").find("stages[0].tokens"),
            std::string::npos);
  EXPECT_NE(expect_error(R"({"model": "m.json", "stages": [{"seq_len": "long", "tokens": 5}]})").find("stages[0].seq_len"),
            std::string::npos);
  EXPECT_NE(expect_error("{not json").find("not valid JSON"), std::string::npos);
}

TEST(RunConfig, TrainerFields) {
  RunConfig r = parse_run_config(R"({"model": "m.json", "router_lr_scale": 0.1, "sample_temperature": 0,
    "micro_batch_tokens": 512, "batch_tokens": 1024, "stages": [{"seq_len": 128, "tokens": 100}]})",
                                 "/tmp/run.json");
  EXPECT_EQ(r.router_lr_scale, 0.1);
  EXPECT_EQ(r.sample_temperature, 0.0);
  RunConfig back = parse_run_config(run_config_to_json(r), "/tmp/run.json");
  EXPECT_EQ(back.router_lr_scale, 0.1);
  // A stage's sequences must fill micro-batches exactly.
  EXPECT_NE(expect_error(R"({"model": "m.json", "micro_batch_tokens": 512, "batch_tokens": 1024,
    "stages": [{"seq_len": 96, "tokens": 100}]})").find("stages[0].seq_len: must divide micro_batch_tokens"),
            std::string::npos);
  EXPECT_NE(expect_error(R"({"model": "m.json", "router_lr_scale": -1, "stages": [{"seq_len": 64, "tokens": 100}]})")
                .find("router_lr_scale"),
            std::string::npos);
}

// The "tokenizer" field: a trained vocabulary by default, "bytes", or a tiktoken directory
// (resolved against the run file's directory); bad forms are refused naming the field.
TEST(RunConfig, TokenizerField) {
  const std::string st = R"("stages": [{"seq_len": 64, "tokens": 100}])";
  RunConfig r = parse_run_config(R"({"model": "m.json", )" + st + "}", "/x/run.json");
  EXPECT_EQ(r.tokenizer.kind, "train");
  EXPECT_EQ(r.tokenizer.vocab_size, 0);  // the model config's
  r = parse_run_config(R"({"model": "m.json", "tokenizer": "bytes", )" + st + "}", "/x/run.json");
  EXPECT_EQ(r.tokenizer.kind, "bytes");
  r = parse_run_config(R"({"model": "m.json", "tokenizer": {"kind": "tiktoken", "dir": "vocab"}, )" + st + "}",
                       "/x/runs/run.json");
  EXPECT_EQ(r.tokenizer.kind, "tiktoken");
  EXPECT_EQ(r.tokenizer.dir, "/x/runs/vocab");
  r = parse_run_config(R"({"model": "m.json", "tokenizer": {"kind": "train", "vocab_size": 1024, "min_frequency": 3}, )" +
                           st + "}",
                       "/x/run.json");
  EXPECT_EQ(r.tokenizer.vocab_size, 1024);
  EXPECT_EQ(r.tokenizer.min_frequency, 3);
  const RunConfig back = parse_run_config(run_config_to_json(r), "/x/run.json");
  EXPECT_EQ(back.tokenizer.kind, "train");
  EXPECT_EQ(back.tokenizer.vocab_size, 1024);
  EXPECT_EQ(back.tokenizer.min_frequency, 3);

  auto err = [&](const std::string& tok) { return expect_error(R"({"model": "m.json", "tokenizer": )" + tok + ", " + st + "}"); };
  EXPECT_NE(err(R"("words")").find("/tmp/run.json: tokenizer: must be"), std::string::npos) << err(R"("words")");
  EXPECT_NE(err(R"("tiktoken")").find("tokenizer: \"tiktoken\" needs a directory"), std::string::npos);
  EXPECT_NE(err(R"({"kind": "tiktoken"})").find("tokenizer.dir: missing"), std::string::npos);
  EXPECT_NE(err(R"({"kind": "train", "vocab_size": 300})").find("tokenizer.vocab_size: 300 is out of range"), std::string::npos);
  EXPECT_NE(err(R"({"kind": "bytes", "vocab_size": 1024})").find("tokenizer.vocab_size: only for"), std::string::npos);
  EXPECT_NE(err(R"({"kind": "train", "size": 1024})").find("tokenizer.size: unknown field"), std::string::npos);
  EXPECT_NE(err(R"({"kind": "train", "min_frequency": 0})").find("tokenizer.min_frequency"), std::string::npos);
  EXPECT_NE(err("7").find("tokenizer: expected"), std::string::npos);
}

// "vision.task_weights": one positive integer per task (default all 1, not written back then,
// so runs without it keep their fingerprint); round trip; bad forms name the field.
TEST(RunConfig, VisionTaskWeights) {
  const std::string head = R"({"model": "m.json", "stages": [{"seq_len": 64, "tokens": 100}], "vision": {"tasks": ["scenes", "arithmetic"])";
  RunConfig plain = parse_run_config(head + "}}", "/tmp/run.json");
  EXPECT_EQ(plain.vision.task_weights, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(run_config_to_json(plain).find("task_weights"), std::string::npos);
  RunConfig w = parse_run_config(head + R"(, "task_weights": [3, 1]}})", "/tmp/run.json");
  EXPECT_EQ(w.vision.task_weights, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(parse_run_config(run_config_to_json(w), "/tmp/run.json").vision.task_weights, w.vision.task_weights);
  for (const char* bad : {R"([3])", R"([3, 0])", R"([3, 1.5])", R"("3,1")"})
    EXPECT_NE(expect_error(head + R"(, "task_weights": )" + bad + "}}").find("vision.task_weights"), std::string::npos) << bad;
}
