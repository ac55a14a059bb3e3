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
