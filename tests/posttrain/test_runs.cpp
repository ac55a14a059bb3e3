// Whole runs on the tiny release-layout model: SFT and RL resume exactly (a run stopped and
// resumed ends with the bitwise weights and optimiser state of the run that never stopped),
// checkpoints are model directories, and bad configs are one clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/fixture.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "posttrain/distill.h"
#include "posttrain/rl.h"
#include "posttrain/sft.h"

namespace fs = std::filesystem;
using namespace k3;

namespace {

std::string tmp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("k3_posttrain_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string p = (fs::path(dir) / name).string();
  std::ofstream(p) << text;
  return p;
}

std::string file_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const char* kSft = R"({"model": "MODEL", "arithmetic": {"digits": [1, 2], "ops": "+*", "problems": 20, "tool_share": 0.3},
  "steps": 4, "batch": 3, "lr": 3e-3, "warmup_steps": 1, "threads": 2, "checkpoint_every": 2, "max_tokens": 4096})";

std::string sft_config(const std::string& dir) {
  std::string s = kSft;
  s.replace(s.find("MODEL"), 5, test::data_path("k3-release-tiny"));
  return write(dir, "sft.json", s);
}

}  // namespace

TEST(PosttrainRuns, SftResumesExactly) {
  const std::string d = tmp_dir("sft");
  const SFTConfig c = load_sft_config(sft_config(d));
  SFTOptions o;
  o.quiet = true;
  o.out_dir = d + "/whole";
  run_sft(c, o);
  o.out_dir = d + "/split";
  o.stop_at_step = 2;
  run_sft(c, o);
  o.resume = true;
  o.stop_at_step = -1;
  const SFTResult r = run_sft(c, o);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/model.safetensors"), file_bytes(d + "/split/checkpoint/model.safetensors"));
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/optimizer.bin"), file_bytes(d + "/split/checkpoint/optimizer.bin"));
  // The fine-tuned model is a model directory with its vocabulary.
  EXPECT_TRUE(fs::exists(d + "/whole/checkpoint/tiktoken.model"));
  EXPECT_NO_THROW(open_model_dir(d + "/whole/checkpoint"));
  // metrics.jsonl of the split run: the resumed run continues at step 3 (one line per step).
  std::ifstream m(d + "/split/metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(m, line);) steps += line.find("\"type\":\"step\"") != std::string::npos;
  EXPECT_EQ(steps, 4);
  // A different config is refused on resume.
  write(d, "sft2.json", file_bytes(d + "/sft.json").replace(file_bytes(d + "/sft.json").find("3e-3"), 4, "2e-3"));
  EXPECT_THROW(run_sft(load_sft_config(d + "/sft2.json"), o), Error);
  fs::remove_all(d);
}

TEST(PosttrainRuns, RlResumesExactly) {
  const std::string d = tmp_dir("rl");
  const std::string rl = R"({"model": ")" + test::data_path("k3-release-tiny") + R"(",
    "arithmetic": {"digits": [1], "ops": "+", "problems": 50, "tool_share": 0.5},
    "steps": 2, "prompts_per_step": 2, "group_size": 3, "budgets": {"low": 6, "high": 10, "max": 14},
    "lr": 1e-3, "threads": 2, "kl_coef": 0.05, "format_penalty": 0.7})";
  const RLConfig c = load_rl_config(write(d, "rl.json", rl));
  RLOptions o;
  o.quiet = true;
  o.out_dir = d + "/whole";
  run_rl(c, o);
  o.out_dir = d + "/split";
  o.stop_at_step = 1;
  run_rl(c, o);
  o.resume = true;
  o.stop_at_step = -1;
  EXPECT_EQ(run_rl(c, o).steps, 2);
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/model.safetensors"), file_bytes(d + "/split/checkpoint/model.safetensors"));
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/optimizer.bin"), file_bytes(d + "/split/checkpoint/optimizer.bin"));
  // A corrupted optimiser state is refused with the file named.
  {
    std::fstream f(d + "/split/checkpoint/optimizer.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('\x7f');
  }
  o.stop_at_step = 3;
  try {
    run_rl(c, o);
    ADD_FAILURE() << "corrupted state accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.bin"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(PosttrainRuns, BadConfigsAreOneClearError) {
  const std::string d = tmp_dir("bad");
  auto err = [&](const std::string& text, bool rl) {
    const std::string p = write(d, "c.json", text);
    try {
      if (rl) load_rl_config(p);
      else load_sft_config(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(R"({"arithmetic": {}})", false).find("model"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "stpes": 3})", false).find("stpes: unknown field"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {"digits": [0]}})", false).find("arithmetic.digits"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "loss": "ppo"})", true).find("loss"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "group_size": 1})", true).find("group_size"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "lambda": 0})", true).find("lambda"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {"efforts": ["medium"]}})", true).find("medium"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "budgets": {"low": 0}})", true).find("budgets"), std::string::npos);
  EXPECT_NE(err("{not json", true).find("c.json"), std::string::npos);
  fs::remove_all(d);
}

TEST(PosttrainRuns, DistillationMovesTheStudentTowardsItsTeachers) {
  const std::string d = tmp_dir("distill");
  // Teacher "low": the tiny model with every weight moved; teacher "high": the tiny model.
  LoadOptions lo;
  lo.dequantize_experts = true;
  lo.log = [](const std::string&) {};
  const std::string tiny = test::data_path("k3-release-tiny");
  K3Model t = load_model(tiny, lo);
  float* w = t.weights().data();
  for (int64_t i = 0; i < t.weights().size(); ++i) w[i] *= 1.0f + 0.3f * float((i * 7919) % 13 - 6) / 6.0f;
  SaveOptions so;
  so.before_commit = [&](const std::string& tmp) { Vocabulary::load_dir(tiny).save(tmp); };
  save_checkpoint(d + "/teacher", t.weights(), so);
  const std::string cfg = R"({"model": ")" + tiny + R"(", "by": "effort",
    "teachers": {"low": ")" + d + R"(/teacher", "high": ")" + tiny + R"("},
    "arithmetic": {"digits": [1], "ops": "+", "problems": 1, "efforts": ["low"]},
    "steps": 5, "prompts_per_step": 1, "samples": 2, "budgets": {"low": 6, "high": 6, "max": 6},
    "lr": 3e-3, "threads": 2})";
  const DistillConfig c = load_distill_config(write(d, "distill.json", cfg));
  run_distill(c, d + "/out", false, -1, true);
  std::ifstream m(d + "/out/metrics.jsonl");
  std::vector<double> kl;
  for (std::string line; std::getline(m, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] == "step") kl.push_back(j["kl"].get<double>());
  }
  ASSERT_EQ(kl.size(), 5u);
  EXPECT_GT(kl[0], 0.0);
  EXPECT_LT(kl[4], 0.8 * kl[0]) << kl[0] << " -> " << kl[4];
  // A teacher key that does not fit `by` is refused.
  std::string bad = cfg;
  bad.replace(bad.find("\"high\""), 6, "\"medium\"");
  EXPECT_THROW(load_distill_config(write(d, "bad.json", bad)), Error);
  fs::remove_all(d);
}
