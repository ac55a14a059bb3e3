// Exact resume and refusals of the training run (train/trainer.h, train/train_state.h):
//  - a run trained straight through equals the same run stopped (--steps) mid-stage, resumed,
//    stopped again exactly at the stage transition and resumed to the end: bitwise equal
//    final weights and optimiser state, identical per-step losses (QB balancing, 2 threads,
//    parallel micro-batches, a sequence-length change in the resumed part);
//  - --resume refuses, with the culprit named and the checkpoint left byte for byte as it
//    was: a run file that differs (naming the field), a corrupted train_state, a missing
//    train_state, corrupted weights; a new run never overwrites an existing checkpoint, and
//    --resume without a checkpoint is refused;
//  - a checkpoint in the pre-release form (final_res_* names, config without the released
//    top-level fields) resumes to the same weights.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"
#include "model/checkpoint.h"
#include "train/run_config.h"
#include "train/train_state.h"
#include "train/trainer.h"
#include "test_trainer_util.h"

namespace fs = std::filesystem;
using namespace k3;
using namespace k3::test;

namespace {

std::map<std::string, std::string> dir_bytes(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (auto& e : fs::directory_iterator(dir)) m[e.path().filename().string()] = read_text(e.path().string());
  return m;
}

std::string error_of(const std::string& run_path, const std::string& out, bool resume) {
  try {
    train_run(run_path, out, resume);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A trained checkpoint (stopped at step 4 of 10) shared by the refusal tests.
struct Trained {
  TrainTempDir t;
  std::string run, out;
  Trained() {
    run = write_run_files(t.path, tiny_run());
    out = t.sub("out");
    train_run(run, out, false, 4);
  }
};

}  // namespace

TEST(TrainerResume, StraightEqualsStoppedAndResumedBitwise) {
  TrainTempDir t;
  const std::string run = write_run_files(t.path, tiny_run());
  const TrainResult a = train_run(run, t.sub("a"), false);
  ASSERT_TRUE(a.complete);
  ASSERT_EQ(a.steps, 10);

  const TrainResult b1 = train_run(run, t.sub("b"), false, 4);  // mid stage 1
  EXPECT_FALSE(b1.complete);
  EXPECT_EQ(b1.steps, 4);
  const TrainResult b2 = train_run(run, t.sub("b"), true, 6);  // exactly at the stage boundary
  EXPECT_EQ(b2.steps, 6);
  const TrainResult b3 = train_run(run, t.sub("b"), true);  // through stage 2 to the end
  ASSERT_TRUE(b3.complete);
  EXPECT_EQ(b3.steps, 10);

  // Weights: the saved checkpoints, bit for bit (the f32 safetensors of the released layout),
  // and the training state's optimiser moments.
  const std::string ca = t.sub("a/checkpoint"), cb = t.sub("b/checkpoint");
  EXPECT_TRUE(read_text(ca + "/model.safetensors") == read_text(cb + "/model.safetensors"));
  EXPECT_TRUE(read_text(ca + "/train_state.safetensors").size() > 0);
  const K3Model ma = load_model(ca), mb = load_model(cb);
  ASSERT_EQ(ma.weights().size(), mb.weights().size());
  EXPECT_EQ(0, std::memcmp(ma.weights().data(), mb.weights().data(), sizeof(float) * size_t(ma.weights().size())));
  // Optimiser state: compare the recorded content hashes of both training states.
  TrainState sa, sb;
  std::vector<float> oa, ob;
  int64_t n = 0;
  {
    const ParamLayout lay(ma.config(), ExpertStorage::Plain);
    for (const ParamSpec& s : lay.specs())
      if (s.name.find("e_score_correction_bias") == std::string::npos) n += 2 * s.numel();
  }
  sa = load_train_state(ca + "/train_state.safetensors", oa, n);
  sb = load_train_state(cb + "/train_state.safetensors", ob, n);
  EXPECT_TRUE(oa == ob);
  EXPECT_EQ(sa.optimizer_steps, 10);
  EXPECT_EQ(sb.optimizer_steps, 10);
  EXPECT_EQ(sa.tokens_seen, sb.tokens_seen);
  // The router biases moved (QB ran) and are part of the weights compared above.
  bool moved = false;
  const float* bias = ma.weights().param("language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias");
  for (int j = 0; j < 8; ++j) moved |= bias[j] != 0.0f;
  EXPECT_TRUE(moved);

  // Per-step losses: identical values, and the resumed metrics file holds each step once.
  const auto la = step_losses(t.sub("a/metrics.jsonl")), lb = step_losses(t.sub("b/metrics.jsonl"));
  ASSERT_EQ(la.size(), 10u);
  ASSERT_EQ(lb.size(), 10u);
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_EQ(la[i].first, int64_t(i + 1));
    EXPECT_EQ(lb[i].first, int64_t(i + 1));
    EXPECT_EQ(la[i].second, lb[i].second) << "step " << i + 1;
  }
  // The step, eval and stage records are the same sequence (nothing logged twice), with the
  // same held-out results.
  auto events = [&](const std::string& path) {
    std::vector<std::string> ev;
    std::istringstream in(read_text(path));
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      const std::string type = j["type"];
      if (type == "eval") ev.push_back("eval " + j["step"].dump() + " " + j["bpb"].dump() + " " + j["maxvio"].dump());
      if (type == "stage" || type == "step") ev.push_back(type + " " + j["step"].dump());
    }
    return ev;
  };
  EXPECT_EQ(events(t.sub("a/metrics.jsonl")), events(t.sub("b/metrics.jsonl")));
  // Stage summaries (held-out evaluation at each stage end) agree too.
  ASSERT_EQ(a.stages.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_TRUE(b3.stages[s].evaluated);
    EXPECT_EQ(a.stages[s].eval_bpb, b3.stages[s].eval_bpb);
    EXPECT_EQ(a.stages[s].tokens, b3.stages[s].tokens);
  }
}

TEST(TrainerResume, RefusesMismatchedRunNamingTheFieldAndKeepsCheckpoint) {
  Trained tr;
  const auto before = dir_bytes(tr.out + "/checkpoint");
  nlohmann::json r = tiny_run();
  r["stages"][1]["tokens"] = 2048;
  const std::string other = write_run_files(tr.t.path, r, "other.json");
  const std::string msg = error_of(other, tr.out, true);
  EXPECT_NE(msg.find("stages[1].tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train_state.safetensors"), std::string::npos) << msg;
  r = tiny_run();
  r["balancer"] = "sign";
  write_run_files(tr.t.path, r, "other.json");
  const std::string msg2 = error_of(other, tr.out, true);
  EXPECT_NE(msg2.find("'balancer'"), std::string::npos) << msg2;
  EXPECT_TRUE(dir_bytes(tr.out + "/checkpoint") == before);
  // Fields that do not shape the trajectory may change (threads, logging, evaluation cadence).
  r = tiny_run();
  r["eval_every"] = 5;
  r["threads"] = 1;
  write_run_files(tr.t.path, r, "other.json");
  EXPECT_EQ(train_run(other, tr.out, true, 5).steps, 5);
}

TEST(TrainerResume, RefusesCorruptedTrainStateAndKeepsCheckpoint) {
  Trained tr;
  const std::string ts = tr.out + "/checkpoint/train_state.safetensors";
  std::string bytes = read_text(ts);
  bytes[bytes.size() - 5] ^= 0x40;  // inside the optimiser moments
  write_text(ts, bytes);
  const auto before = dir_bytes(tr.out + "/checkpoint");
  const std::string msg = error_of(tr.run, tr.out, true);
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.state"), std::string::npos) << msg;
  EXPECT_TRUE(dir_bytes(tr.out + "/checkpoint") == before);
  // A truncated file is refused by the safetensors reader, naming the file.
  write_text(ts, bytes.substr(0, bytes.size() / 2));
  const std::string msg2 = error_of(tr.run, tr.out, true);
  EXPECT_NE(msg2.find("train_state.safetensors"), std::string::npos) << msg2;
}

TEST(TrainerResume, RefusesMissingTrainStateAndCorruptedWeights) {
  Trained tr;
  const std::string ck = tr.out + "/checkpoint";
  const std::string st = read_text(ck + "/train_state.safetensors");
  fs::remove(ck + "/train_state.safetensors");
  std::string msg = error_of(tr.run, tr.out, true);
  EXPECT_NE(msg.find("train_state.safetensors: missing"), std::string::npos) << msg;
  write_text(ck + "/train_state.safetensors", st);

  std::string w = read_text(ck + "/model.safetensors");
  w[w.size() - 3] ^= 0x01;  // one bit of the last weight
  write_text(ck + "/model.safetensors", w);
  const auto before = dir_bytes(ck);
  msg = error_of(tr.run, tr.out, true);
  EXPECT_NE(msg.find("weights"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;
  EXPECT_TRUE(dir_bytes(ck) == before);

  fs::remove(ck + "/model.safetensors");
  msg = error_of(tr.run, tr.out, true);
  EXPECT_FALSE(msg.empty());
}

TEST(TrainerResume, NewRunNeverOverwritesAndResumeNeedsACheckpoint) {
  Trained tr;
  const auto before = dir_bytes(tr.out + "/checkpoint");
  std::string msg = error_of(tr.run, tr.out, false);
  EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;
  EXPECT_TRUE(dir_bytes(tr.out + "/checkpoint") == before);
  msg = error_of(tr.run, tr.t.sub("empty"), true);
  EXPECT_NE(msg.find("no checkpoint to resume"), std::string::npos) << msg;
}

// A training checkpoint as k3cpp wrote it before the release's names and config fields
// (output AttnRes read as final_res_*, config.json and the recorded model config without
// architectures / tie_word_embeddings / text_config.model_type) resumes, with a notice, to
// the same final weights as the straight run.
TEST(TrainerResume, PreReleaseCheckpointResumes) {
  TrainTempDir t;
  const std::string run = write_run_files(t.path, tiny_run());
  ASSERT_TRUE(train_run(run, t.sub("a"), false).complete);
  ASSERT_EQ(train_run(run, t.sub("b"), false, 4).steps, 4);
  const std::string ck = t.sub("b/checkpoint");
  auto old_config = [](const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text);
    j.erase("architectures");
    j.erase("tie_word_embeddings");
    j["text_config"].erase("model_type");
    return j.dump(2);
  };
  {
    std::vector<std::pair<std::string, Tensor>> ts;
    {
      const CheckpointReader r = CheckpointReader::open(ck + "/model.safetensors");
      for (const std::string& n : r.names()) {
        const std::string old = legacy_param_name(n);
        ts.emplace_back(old.empty() ? n : old, r.get(n).clone());
      }
    }
    write_checkpoint_shards(ck, ts, uint64_t(1) << 40, {{"format", "pt"}});
    write_text(ck + "/config.json", old_config(read_text(ck + "/config.json")));
    int64_t n = 0;
    const ParamLayout lay(load_config(ck + "/config.json"), ExpertStorage::Plain);
    for (const ParamSpec& s : lay.specs())
      if (s.name.find("e_score_correction_bias") == std::string::npos) n += 2 * s.numel();
    std::vector<float> opt;
    TrainState st = load_train_state(ck + "/train_state.safetensors", opt, n);
    st.model_json = old_config(st.model_json);
    save_train_state(ck + "/train_state.safetensors", st, opt);
  }
  ASSERT_TRUE(CheckpointReader::open(ck).has(legacy_param_name(kOutputAttnResNormName)));
  ASSERT_TRUE(train_run(run, t.sub("b"), true).complete);
  const K3Model ma = load_model(t.sub("a/checkpoint")), mb = load_model(ck);
  ASSERT_EQ(ma.weights().size(), mb.weights().size());
  EXPECT_EQ(0, std::memcmp(ma.weights().data(), mb.weights().data(), sizeof(float) * size_t(ma.weights().size())));
  EXPECT_TRUE(CheckpointReader::open(ck).has(kOutputAttnResNormName));  // saved again under the released name
}
