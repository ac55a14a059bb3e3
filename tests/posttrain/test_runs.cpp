// Whole runs on the tiny release-layout model: SFT and RL resume exactly (a run stopped and
// resumed ends with the bitwise weights and optimiser state of the run that never stopped),
// checkpoints are model directories, and bad configs are one clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/fixture.h"
#include "run_helpers.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "posttrain/distill.h"
#include "posttrain/rl.h"
#include "posttrain/sft.h"

namespace fs = std::filesystem;
using namespace k3;

namespace {

std::string run_dir(const std::string& name) { return test::scratch_dir("k3_posttrain_" + name); }
std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  return test::write_text(dir, name, text);
}
using test::file_bytes;

const char* kSft = R"({"model": "MODEL", "arithmetic": {"digits": [1, 2], "ops": "+*", "problems": 20, "tool_share": 0.3},
  "steps": 4, "batch": 3, "lr": 3e-3, "warmup_steps": 1, "threads": 2, "checkpoint_every": 2, "max_tokens": 4096})";

std::string sft_config(const std::string& dir) {
  std::string s = kSft;
  s.replace(s.find("MODEL"), 5, test::data_path("k3-release-tiny"));
  return write_file(dir, "sft.json", s);
}

}  // namespace

TEST(PosttrainRuns, SftResumesExactly) {
  const std::string d = run_dir("sft");
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
  write_file(d, "sft2.json", file_bytes(d + "/sft.json").replace(file_bytes(d + "/sft.json").find("3e-3"), 4, "2e-3"));
  EXPECT_THROW(run_sft(load_sft_config(d + "/sft2.json"), o), Error);
  fs::remove_all(d);
}

// The step records of metrics.jsonl without their wall times.
std::vector<nlohmann::json> step_records(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream m(path);
  for (std::string line; std::getline(m, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] != "step") continue;
    for (const char* k : {"seconds", "rollout_seconds", "update_seconds"}) j.erase(k);
    out.push_back(j);
  }
  return out;
}

// Partial rollouts (lambda 0.5) across a checkpoint: the run stopped after step 1 with
// trajectories mid-decode in its buffer and resumed ends bitwise where the run that never
// stopped does (weights, optimiser, every step's metrics). Seed 4 makes some replies end
// early on this random model, so groups have reward variance and steps 2-3 train, partly on
// tokens drawn before the checkpoint (stale_tokens > 0); a restored group is trained, so the
// saved decode state matters (checked by hand: zeroing the restored KDA states on load changes
// the final weights at this seed).
TEST(PosttrainRuns, RlResumesExactlyWithPartialRollouts) {
  const std::string d = run_dir("rl");
  const std::string rl = R"({"model": ")" + test::data_path("k3-release-tiny") + R"(",
    "arithmetic": {"bands": ["1+"], "problems": 50, "tool_share": 0.5},
    "steps": 3, "prompts_per_step": 3, "group_size": 4, "budgets": {"low": 20, "high": 30, "max": 40},
    "tool_budgets": {"low": 25, "high": 35, "max": 45}, "lambda": 0.5, "checkpoint_every": 1,
    "lr": 1e-3, "threads": 1, "kl_coef": 0.05, "format_penalty": 0.7, "seed": 4})";
  const RLConfig c = load_rl_config(write_file(d, "rl.json", rl));
  RLOptions o = test::run_whole_then_stop_after_step_1(c, d);
  // The stop left trajectories mid-decode; they are in the checkpoint.
  ASSERT_TRUE(fs::exists(d + "/split/checkpoint/rollouts.bin"));
  EXPECT_EQ(run_rl(c, o).steps, 3);
  const std::vector<nlohmann::json> whole = step_records(d + "/whole/metrics.jsonl"),
                                    split = step_records(d + "/split/metrics.jsonl");
  ASSERT_EQ(whole.size(), 3u);
  ASSERT_EQ(split.size(), 3u);
  int64_t kept = 0, stale = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(whole[i].dump(), split[i].dump()) << "step " << i + 1;
    kept += whole[i]["kept"].get<int64_t>(), stale += whole[i]["stale_tokens"].get<int64_t>();
  }
  EXPECT_GT(kept, 0);   // the weights moved
  EXPECT_GT(stale, 0);  // tokens of an older policy were trained on
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/model.safetensors"), file_bytes(d + "/split/checkpoint/model.safetensors"));
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/optimizer.bin"), file_bytes(d + "/split/checkpoint/optimizer.bin"));
  EXPECT_EQ(file_bytes(d + "/whole/checkpoint/rollouts.json"), file_bytes(d + "/split/checkpoint/rollouts.json"));
  // A corrupted optimiser state or rollout buffer is refused with the file named.
  for (const char* f : {"optimizer.bin", "rollouts.bin"}) {
    fs::remove_all(d + "/bad");
    fs::copy(d + "/split", d + "/bad", fs::copy_options::recursive);
    {
      std::fstream b(d + "/bad/checkpoint/" + f, std::ios::in | std::ios::out | std::ios::binary);
      b.seekp(8);
      b.put('\x7f');
    }
    o.out_dir = d + "/bad";
    o.stop_at_step = 4;
    try {
      run_rl(c, o);
      ADD_FAILURE() << "corrupted " << f << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  }
  fs::remove_all(d);
}

TEST(PosttrainRuns, BadConfigsAreOneClearError) {
  const std::string d = run_dir("bad");
  auto err = [&](const std::string& text, bool rl) { return test::posttrain_config_error(d, text, rl); };
  EXPECT_NE(err(R"({"arithmetic": {}})", false).find("model"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "stpes": 3})", false).find("stpes: unknown field"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {"digits": [0]}})", false).find("arithmetic.digits"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "loss": "ppo"})", true).find("loss"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "group_size": 1})", true).find("group_size"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "lambda": 0})", true).find("lambda"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {"efforts": ["medium"]}})", true).find("medium"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "budgets": {"low": 0}})", true).find("budgets.low: must be at least 1"),
            std::string::npos);
  EXPECT_NE(err("{not json", true).find("c.json"), std::string::npos);
  // The curriculum's bands and the tool budgets.
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {"bands": ["2+", "4-"]}})", true).find("arithmetic.bands[1]"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {"bands": []}})", true).find("arithmetic.bands"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {"bands": ["2+"], "digits": [2]}})", true).find("not both"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "eval": {"problems": 4, "problems_per_band": 2}})", true)
                .find("eval.problems_per_band"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "tool_budgets": {"low": 0}})", true).find("tool_budgets.low"), std::string::npos);
  EXPECT_NE(err(R"({"model": "x", "arithmetic": {}, "tool_budgets": {"lo": 9}})", true).find("tool_budgets.lo: unknown field"), std::string::npos);
  {
    const RLConfig c = load_rl_config(write_file(d, "ok.json", R"({"model": "x", "arithmetic": {"bands": ["3+", "2*"]},
      "eval": {"bands": ["2+"], "problems_per_band": 7, "efforts": ["high", "max"]},
      "budgets": {"low": 48, "high": 128, "max": 320}, "tool_budgets": {"low": 112}})"));
    EXPECT_EQ(c.eval->problems, 7);
    EXPECT_EQ(c.budget(chat::Effort::low, false), 48);
    EXPECT_EQ(c.budget(chat::Effort::low, true), 112);
    EXPECT_EQ(c.budget(chat::Effort::high, true), 128);  // not given: the effort's budget
    // The curriculum: only the named bands, every band equally often, efforts crossed with bands.
    std::map<std::string, int> seen;
    for (int64_t i = 0; i < 8; ++i) {
      const ArithItem it = arith_item(c.train, i);
      seen[std::to_string(it.problem.digits) + it.problem.op + chat::effort_name(it.effort)]++;
      EXPECT_EQ(it.problem.expression().size(), it.problem.op == '+' ? 7u : 5u);  // 3+3 or 2*2 digits
    }
    EXPECT_EQ(seen.size(), 6u);  // {3+, 2*} x {low, high, max}
  }
  fs::remove_all(d);
}

TEST(PosttrainRuns, DistillationMovesTheStudentTowardsItsTeachers) {
  const std::string d = run_dir("distill");
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
  const DistillConfig c = load_distill_config(write_file(d, "distill.json", cfg));
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
  EXPECT_THROW(load_distill_config(write_file(d, "bad.json", bad)), Error);
  // Budgets are read as rl.json's are: each at least 1, the field named.
  std::string zero = cfg;
  zero.replace(zero.find("\"low\": 6"), 8, "\"low\": 0");
  try {
    load_distill_config(write_file(d, "zero.json", zero));
    ADD_FAILURE() << "a zero budget was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("budgets.low: must be at least 1"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}
