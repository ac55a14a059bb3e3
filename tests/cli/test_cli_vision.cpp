// A training run with images, then `k3cpp generate --image`, as the built binary: a tiny text
// model (configs/train-tiny-model.json's shape, byte tokenizer) with a tiny encoder trains a
// few steps on text plus all three image-text tasks; the metrics carry the encoder's gradient
// norm and losses per step, the checkpoint holds vision.safetensors and a config.json with
// vision_config, the end-of-run evaluation writes vision_eval.json with the blind baselines,
// `k3cpp eval --task vision` repeats it on the saved directory, and generate --image runs the encoder on a PGM and a PNG; a model without vision, a missing
// image and a bad vision block in the run file are refused with the culprit named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cli_run.h"

using json = nlohmann::json;

namespace {

using k3::test::RunResult;
using k3::test::q;

}  // namespace

TEST(CliVision, TrainWithImagesThenGenerateWithAnImage) {
  k3::test::TempDir tmp("k3_cli_vision");
  json model = json::parse(k3::test::slurp(std::string(K3_SOURCE_DIR) + "/configs/train-tiny-model.json"));
  model["text_config"]["vocab_size"] = 264;
  model["media_placeholder_token_id"] = 263;
  model["vision_config"] = {{"vt_num_hidden_layers", 1}, {"vt_hidden_size", 16}, {"vt_num_attention_heads", 2},
                            {"qkv_hidden_size", 16},     {"vt_intermediate_size", 32}, {"patch_size", 4},
                            {"init_pos_emb_height", 4},  {"init_pos_emb_width", 4}, {"merge_kernel_size", {2, 2}},
                            {"text_hidden_size", 64}};
  std::ofstream(tmp.sub("model.json")) << model.dump(2);
  json run = json::parse(k3::test::slurp(std::string(K3_SOURCE_DIR) + "/configs/train-tiny.json"));
  run["model"] = tmp.sub("model.json");
  run["tokenizer"] = "bytes";
  run["batch_tokens"] = 256, run["micro_batch_tokens"] = 128;
  run["stages"] = json::array({{{"name", "s"}, {"seq_len", 64}, {"tokens", 768}, {"lr_peak", 0.01}}});
  run["eval_every"] = 0, run["checkpoint_every"] = 100, run["sample_tokens"] = 4;
  run["vision"] = {{"tasks", {"fashion", "scenes", "arithmetic"}}, {"examples_per_micro_batch", 3}, {"eval_examples", 6}};
  std::ofstream(tmp.sub("run.json")) << run.dump(2);
  const RunResult r = k3::test::run_k3cpp("train --config " + q(tmp.sub("run.json")) + " --out " + q(tmp.sub("out")));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("vision fashion: accuracy"), std::string::npos) << r.err;
  std::istringstream lines(k3::test::slurp(tmp.sub("out/metrics.jsonl")));
  std::string line;
  int steps = 0;
  while (std::getline(lines, line)) {
    const json j = json::parse(line);
    if (j["type"] != "step") continue;
    ++steps;
    EXPECT_GT(j["vision_grad_norm"].get<double>(), 0.0);
    EXPECT_GT(j["vision_targets"].get<int64_t>(), 0);
    EXPECT_EQ(j["encoder_images"].get<int64_t>(), 6);  // 3 per micro-batch, 2 micro-batches
  }
  EXPECT_EQ(steps, 3);
  const std::string ck = tmp.sub("out/checkpoint");
  EXPECT_TRUE(std::filesystem::exists(ck + "/vision.safetensors"));
  EXPECT_NE(k3::test::slurp(ck + "/config.json").find("vision_config"), std::string::npos);
  const json ev = json::parse(k3::test::slurp(tmp.sub("out/vision_eval.json")));
  for (const char* task : {"fashion", "scenes", "arithmetic"})
    for (const char* mode : {"image", "zeros", "other_image"}) EXPECT_EQ(ev[task][mode]["examples"], 6) << task << mode;
  EXPECT_EQ(ev["fashion"]["confusion_predicted_by_true"].size(), 11u);
  EXPECT_TRUE(ev["scenes"]["image"].contains("by_question"));

  // The same evaluation on the saved model directory (k3cpp eval --task vision).
  const RunResult e = k3::test::run_k3cpp("eval " + q(ck) + " --task vision --run " + q(tmp.sub("run.json")) +
                                          " --examples 2 --json " + q(tmp.sub("ev.json")));
  ASSERT_EQ(e.rc, 0) << e.err;
  const json ev2 = json::parse(k3::test::slurp(tmp.sub("ev.json")));
  EXPECT_EQ(ev2["scenes"]["zeros"]["examples"], 2);
  EXPECT_EQ(ev2["fashion"]["image"]["accuracy"], json::parse(e.out)["fashion"]["image"]["accuracy"]);

  // generate --image: a 28 x 28 PGM (8 x 8 patches, 16 image tokens) and the same as PNG.
  {
    std::ofstream f(tmp.sub("a.pgm"), std::ios::binary);
    f << "P5\n28 28\n255\n";
    for (int i = 0; i < 784; ++i) f.put(char((i * 7) % 256));
  }
  const RunResult g = k3::test::run_k3cpp("generate " + q(ck) + " --image " + q(tmp.sub("a.pgm")) +
                                          " --prompt ' what is this? ' --max-tokens 3");
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_NE(g.err.find("-> 8x8 patches -> 16 tokens"), std::string::npos) << g.err;
  EXPECT_NE(g.err.find("prefill 31 tokens"), std::string::npos) << g.err;  // 16 + " what is this? " (15 bytes)
  const RunResult missing = k3::test::run_k3cpp("generate " + q(ck) + " --image " + q(tmp.sub("none.png")) + " --prompt x");
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("none.png"), std::string::npos) << missing.err;
  // The released-layout fixture's vision tensors (patch 4, 4 x 4 table, 2 blocks) run too.
  const RunResult rel = k3::test::run_k3cpp("generate " + q(std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny") +
                                            " --image " + q(tmp.sub("a.pgm")) + " --ids 1,2 --ids-out --max-tokens 2");
  EXPECT_EQ(rel.rc, 0) << rel.err;
  EXPECT_NE(rel.err.find("-> 8x8 patches -> 16 tokens"), std::string::npos) << rel.err;
  // A text-only model refuses --image, naming vision_config.
  ASSERT_EQ(k3::test::run_k3cpp("init " + q(std::string(K3_SOURCE_DIR) + "/configs/train-tiny-model.json") + " " +
                                q(tmp.sub("text")) + " --seed 1").rc, 0);
  const RunResult novis = k3::test::run_k3cpp("generate " + q(tmp.sub("text")) + " --image " + q(tmp.sub("a.pgm")) +
                                              " --ids 1,2 --ids-out");
  EXPECT_NE(novis.rc, 0);
  EXPECT_NE(novis.err.find("vision_config"), std::string::npos) << novis.err;
  run["vision"]["tasks"] = {"colours"};
  std::ofstream(tmp.sub("bad.json")) << run.dump(2);
  const RunResult bad = k3::test::run_k3cpp("train --config " + q(tmp.sub("bad.json")) + " --out " + q(tmp.sub("o2")));
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("vision.tasks"), std::string::npos) << bad.err;
}
