// Exact resume of a joint vision + text run (train/trainer.h, train/trainer_vision.h): the tiny
// trainer-test model with a one-block encoder, rendered scenes and arithmetic (weighted 2:1)
// in every micro-batch; a run trained straight through equals the same run stopped mid-stage, resumed,
// stopped at the stage transition and resumed to the end: bitwise equal text weights, encoder
// weights (vision.safetensors) and optimiser state, identical per-step text and vision losses
// and encoder gradient norms, the same end-of-run vision evaluation. A corrupted encoder file,
// or a run file that drops the "vision" block, is refused naming the culprit.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_trainer_util.h"

namespace fs = std::filesystem;
using namespace k3;
using namespace k3::test;

namespace {

nlohmann::json vision_run() {
  nlohmann::json r = tiny_run();
  // The rendered tasks only (no Fashion-MNIST files to read: a faster test), scenes weighted 2:1.
  r["vision"] = {{"tasks", {"scenes", "arithmetic"}}, {"task_weights", {2, 1}}, {"examples_per_micro_batch", 2},
                 {"eval_examples", 4}};
  return r;
}

std::string write_vision_files(const std::string& dir, const nlohmann::json& run) {
  const std::string path = write_run_files(dir, run, "run.json", 264);
  nlohmann::json model = nlohmann::json::parse(tiny_model_json(264));
  model["media_placeholder_token_id"] = 263;
  model["vision_config"] = {{"vt_num_hidden_layers", 1}, {"vt_hidden_size", 16}, {"vt_num_attention_heads", 2},
                            {"qkv_hidden_size", 16},     {"vt_intermediate_size", 32}, {"patch_size", 4},
                            {"init_pos_emb_height", 4},  {"init_pos_emb_width", 4},    {"merge_kernel_size", {2, 2}},
                            {"text_hidden_size", 32}};
  write_text(dir + "/model.json", model.dump(2));
  return path;
}

// Per step: loss, vision_loss, vision_grad_norm (as written: the JSON numbers' text).
std::vector<std::string> vision_steps(const std::string& metrics) {
  std::vector<std::string> out;
  std::istringstream in(read_text(metrics));
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] != "step") continue;
    out.push_back(j["step"].dump() + " " + j["loss"].dump() + " " + j["vision_loss"].dump() + " " +
                  j["vision_grad_norm"].dump());
  }
  return out;
}

std::string error_of(const std::string& run, const std::string& out) {
  try {
    train_run(run, out, true);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainerResumeVision, StraightEqualsStoppedAndResumedBitwise) {
  TrainTempDir t;
  const std::string run = write_vision_files(t.path, vision_run());
  const TrainResult a = train_run(run, t.sub("a"), false);
  ASSERT_TRUE(a.complete);
  ASSERT_EQ(a.steps, 10);
  EXPECT_EQ(train_run(run, t.sub("b"), false, 4).steps, 4);  // mid stage 1
  EXPECT_EQ(train_run(run, t.sub("b"), true, 6).steps, 6);   // at the stage boundary
  const TrainResult b = train_run(run, t.sub("b"), true);    // to the end
  ASSERT_TRUE(b.complete);

  const std::string ca = t.sub("a/checkpoint"), cb = t.sub("b/checkpoint");
  for (const char* f : {"model.safetensors", "vision.safetensors"}) {
    const std::string fa = read_text(ca + "/" + f), fb = read_text(cb + "/" + f);
    EXPECT_FALSE(fa.empty()) << f;
    EXPECT_TRUE(fa == fb) << f << " differs";
  }
  // The training states (whose timings differ): the same optimiser moments (text and encoder:
  // one content hash over both), encoder hash and image-text stream position.
  auto state = [](const std::string& dir) {
    return nlohmann::json::parse(SafetensorsFile::open(dir + "/train_state.safetensors")->metadata().at("k3cpp.train_state"));
  };
  const nlohmann::json ta = state(ca), tb = state(cb);
  for (const char* k : {"optimizer_hash", "optimizer_elements", "weights_hash", "vision_hash", "vision_cursor", "step"})
    EXPECT_EQ(ta[k], tb[k]) << k;
  EXPECT_EQ(ta["vision_cursor"], 10 * 2 * 2 * 1);  // 10 steps of 2 micro-batches of 2 examples
  const auto sa = vision_steps(t.sub("a/metrics.jsonl")), sb = vision_steps(t.sub("b/metrics.jsonl"));
  ASSERT_EQ(sa.size(), 10u);
  EXPECT_EQ(sa, sb);
  EXPECT_EQ(read_text(t.sub("a/vision_eval.json")), read_text(t.sub("b/vision_eval.json")));
  EXPECT_FALSE(read_text(t.sub("a/vision_eval.json")).empty());

  // Refusals, each naming its culprit; the encoder's bytes changed after the header.
  {
    TrainTempDir u;
    const std::string r2 = write_vision_files(u.path, vision_run());
    train_run(r2, u.sub("o"), false, 2);
    const std::string vf = u.sub("o/checkpoint/vision.safetensors");
    std::string bytes = read_text(vf);
    bytes[bytes.size() - 3] ^= 0x40;
    write_text(vf, bytes);
    const std::string e = error_of(r2, u.sub("o"));
    EXPECT_NE(e.find("vision.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("content hash"), std::string::npos) << e;
    nlohmann::json no_vision = vision_run();
    no_vision.erase("vision");
    write_text(u.sub("run.json"), no_vision.dump(2));
    const std::string e2 = error_of(u.sub("run.json"), u.sub("o"));
    EXPECT_FALSE(e2.empty());
    EXPECT_NE(e2.find("vision"), std::string::npos) << e2;
  }
}
