// The released checkpoint layout (model/release_layout.h, docs/architecture.md "Tensor
// names") on tests/data/k3-release-tiny, written by tools/make_release_fixture.py:
//  - the fixture's config parses with every released field, and the model loads (MXFP4
//    experts, A_log zero-padded to 16 entries for 2 heads) and runs a finite forward;
//  - its vision tensors are skipped with ONE log line (count + prefixes), and checked
//    against vision_config (a block beyond vt_num_hidden_layers is refused);
//  - the pre-release names final_res_norm/final_res_proj load with one notice and the same
//    weights; both names at once are refused;
//  - A_log as [H] loads the same weights; non-zero padding is refused naming file + tensor;
//  - saving writes the released names, quantization_config only with MXFP4 experts, and no
//    vision_config;
//  - the generator reproduces the committed fixture byte for byte.
#include <gtest/gtest.h>

#include "common/cli_run.h"
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/release_layout.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

using k3::test::kReleaseTiny;

const std::string kALog1 = layer_prefix(1) + "self_attn.A_log";  // a KDA layer's A_log

using test::TempDir;

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Loaded {
  K3Model model;
  std::vector<std::string> log;
};
Loaded load_logged(const std::string& dir) {
  std::vector<std::string> log;
  LoadOptions lo;
  lo.log = [&](const std::string& line) { log.push_back(line); };
  K3Model m = load_model(dir, lo);
  return {std::move(m), log};
}

using Tensors = std::vector<std::pair<std::string, Tensor>>;

// Every tensor of the fixture (views into its mmap'ed shards, kept alive by the reader).
Tensors fixture_tensors(const CheckpointReader& ck) {
  Tensors ts;
  for (const std::string& n : ck.names()) ts.emplace_back(n, ck.get(n));
  return ts;
}

// A model directory: the fixture's config.json and `ts` in one model.safetensors.
std::string write_dir(const TempDir& t, const std::string& name, const Tensors& ts) {
  const std::string dir = t.sub(name);
  fs::create_directories(dir);
  fs::copy_file(kReleaseTiny + "/config.json", dir + "/config.json");
  write_checkpoint_shards(dir, ts, uint64_t(1) << 40);
  return dir;
}

Tensor& find(Tensors& ts, const std::string& name) {
  for (auto& [n, t] : ts)
    if (n == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  static Tensor none;
  return none;
}

bool same_dense(const WeightStore& a, const WeightStore& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), size_t(a.size()) * sizeof(float)) == 0;
}

template <typename F>
void expect_error(F&& f, const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing " << pieces[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

}  // namespace

TEST(ReleaseLayout, FixtureConfigHasTheReleasedFields) {
  const K3Config c = load_config(kReleaseTiny + "/config.json");
  EXPECT_EQ(c.model_type, "kimi_k3");
  EXPECT_EQ(c.architectures, (std::vector<std::string>{"KimiK3ForConditionalGeneration"}));
  EXPECT_EQ(c.vocab_size, 288 + 256);  // base vocabulary, then 256 reserved special ids
  EXPECT_EQ(c.bos_token_id, 288);
  EXPECT_EQ(c.eos_token_id, 288 + 2);  // <|end_of_msg|>
  EXPECT_EQ(c.pad_token_id, 288 + 255);
  EXPECT_EQ(c.media_placeholder_token_id, 288 + 21);
  ASSERT_TRUE(c.quantization.present);
  EXPECT_EQ(c.quantization.quant_method, "compressed-tensors");
  EXPECT_EQ(c.quantization.format, "mxfp4-pack-quantized");
  EXPECT_EQ(c.quantization.ignore.size(), 6u);
  ASSERT_TRUE(c.vision.present);
  EXPECT_EQ(c.vision.num_hidden_layers, 2);
  EXPECT_EQ(c.vision.hidden_size, 16);
  EXPECT_EQ(c.vision.text_hidden_size, c.hidden_size);
  EXPECT_EQ(c.vision.merge_kernel_size, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c.kda_num_heads, 2);
  EXPECT_EQ(c.kda_head_dim, 16);
}

TEST(ReleaseLayout, FixtureLoadsSkipsVisionInOneLineAndRuns) {
  Loaded l = load_logged(kReleaseTiny);
  ASSERT_EQ(l.log.size(), 1u) << "expected only the vision line";
  const std::string& line = l.log[0];
  for (const char* piece : {"skipped 18 vision tensor(s)", "vision_tower.*: 15", "mm_projector.*: 3", "checked"})
    EXPECT_NE(line.find(piece), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(l.model.weights().expert_storage(), ExpertStorage::Mxfp4);

  // A_log: the first H entries of the stored F32 [16].
  const CheckpointReader ck = CheckpointReader::open(kReleaseTiny);
  EXPECT_EQ(ck.info(kALog1).shape, (Shape{16}));
  const Tensor stored = ck.get(kALog1);
  const float* w = l.model.weights().param(kALog1);
  EXPECT_EQ(w[0], stored.data<float>()[0]);
  EXPECT_EQ(w[1], stored.data<float>()[1]);
  EXPECT_NE(w[0], 0.0f);
  // The output AttnRes read under its released name (bf16 in the file).
  const Tensor proj = ck.get(kOutputAttnResProjName).to_f32();
  EXPECT_EQ(l.model.weights().param(kOutputAttnResProjName)[5], proj.data<float>()[5]);

  const std::vector<int32_t> ids = {288, 5, 17, 300, 100, 290};  // [BOS], bytes, a merge, a special
  const int64_t V = l.model.config().vocab_size, T = int64_t(ids.size());
  std::vector<float> logits(size_t(T * V));
  auto st = l.model.new_state();
  ForwardScratch scratch;
  l.model.forward(logits.data(), ids.data(), T, st, scratch);
  double sum = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum += std::fabs(v);
  }
  EXPECT_GT(sum / double(logits.size()), 1e-3);  // not a zero model
}

TEST(ReleaseLayout, PreReleaseNamesLoadWithOneNotice) {
  TempDir t;
  const CheckpointReader ck = CheckpointReader::open(kReleaseTiny);
  Tensors ts = fixture_tensors(ck);
  for (auto& [n, x] : ts)
    if (const std::string old = legacy_param_name(n); !old.empty()) n = old;
  const std::string dir = write_dir(t, "old", ts);
  Loaded fresh = load_logged(kReleaseTiny);
  Loaded old = load_logged(dir);
  ASSERT_EQ(old.log.size(), 2u);  // the names notice, then the vision line
  for (const char* piece : {"final_res_norm.weight", "final_res_proj.weight", "output_attn_res_norm.weight", dir.c_str()})
    EXPECT_NE(old.log[0].find(piece), std::string::npos) << old.log[0];
  EXPECT_TRUE(same_dense(fresh.model.weights(), old.model.weights()));

  // Both names at once: which one is meant is not clear, so refuse.
  ts.emplace_back(kOutputAttnResNormName, ck.get(kOutputAttnResNormName));
  const std::string both = write_dir(t, "both", ts);
  expect_error([&] { load_model(both); }, {"final_res_norm.weight", "output_attn_res_norm.weight", "both"});
}

TEST(ReleaseLayout, ALogPerHeadLoadsTheSameAndNonZeroPaddingIsRefused) {
  TempDir t;
  const CheckpointReader ck = CheckpointReader::open(kReleaseTiny);
  Loaded fresh = load_logged(kReleaseTiny);
  {
    Tensors ts = fixture_tensors(ck);
    for (auto& [n, x] : ts)
      if (n.size() > 6 && n.compare(n.size() - 6, 6, ".A_log") == 0) x = x.slice0(0, 2).clone();  // k3cpp's [H]
    const std::string dir = write_dir(t, "per_head", ts);
    EXPECT_TRUE(same_dense(fresh.model.weights(), load_logged(dir).model.weights()));
  }
  Tensors ts = fixture_tensors(ck);
  Tensor bad = find(ts, kALog1).clone();
  bad.data<float>()[5] = 0.25f;
  find(ts, kALog1) = bad;
  const std::string dir = write_dir(t, "bad_pad", ts);
  expect_error([&] { load_model(dir); }, {dir + "/model.safetensors", kALog1, "16 entries for 2 KDA heads", "not zero",
                                          "entry 5 = 0.25"});
  // A 2-D A_log is not the padded form: a plain shape error.
  Tensors ts2 = fixture_tensors(ck);
  find(ts2, kALog1) = Tensor::zeros(DType::F32, {2, 8});
  const std::string dir2 = write_dir(t, "bad_shape", ts2);
  expect_error([&] { load_model(dir2); }, {kALog1, "shape [2, 8]", "expected [2]"});
}

TEST(ReleaseLayout, VisionTensorsAreCheckedAgainstVisionConfig) {
  TempDir t;
  const CheckpointReader ck = CheckpointReader::open(kReleaseTiny);
  Tensors ts = fixture_tensors(ck);
  const std::string extra = "vision_tower.encoder.blocks.2.norm0.weight";  // vt_num_hidden_layers is 2
  ts.emplace_back(extra, Tensor::zeros(DType::BF16, {16}));
  const std::string dir = write_dir(t, "extra_block", ts);
  expect_error([&] { load_model(dir); }, {extra, "block 2", "vt_num_hidden_layers is 2"});

  Tensors ts2 = fixture_tensors(ck);
  find(ts2, "vision_tower.encoder.final_layernorm.weight") = Tensor::zeros(DType::BF16, {8});
  const std::string dir2 = write_dir(t, "bad_width", ts2);
  expect_error([&] { load_model(dir2); }, {"vision_tower.encoder.final_layernorm.weight", "shape [8]", "vt_hidden_size 16"});

  // Without a vision_config the vision tensors are still skipped, and the line says so.
  const std::string dir3 = write_dir(t, "no_vision_config", fixture_tensors(ck));
  nlohmann::json cj = nlohmann::json::parse(slurp(dir3 + "/config.json"));
  cj.erase("vision_config");
  std::ofstream(dir3 + "/config.json") << cj.dump(2);
  Loaded l = load_logged(dir3);
  ASSERT_EQ(l.log.size(), 1u);
  EXPECT_NE(l.log[0].find("no vision_config"), std::string::npos) << l.log[0];
}

TEST(ReleaseLayout, SaveWritesReleasedNamesAndMatchingConfig) {
  TempDir t;
  Loaded l = load_logged(kReleaseTiny);
  SaveOptions so;  // dense f32: exact for the file's bf16 and f32 tensors alike
  so.experts = ExpertStorage::Mxfp4;
  save_checkpoint(t.sub("mx"), l.model.weights(), so);
  const CheckpointReader mx = CheckpointReader::open(t.sub("mx"));
  EXPECT_TRUE(mx.has(kOutputAttnResNormName));
  EXPECT_FALSE(mx.has(legacy_param_name(kOutputAttnResNormName)));
  nlohmann::json cj = nlohmann::json::parse(slurp(t.sub("mx") + "/config.json"));
  EXPECT_EQ(cj["model_type"], "kimi_k3");
  EXPECT_EQ(cj["architectures"], nlohmann::json::array({"KimiK3ForConditionalGeneration"}));
  EXPECT_EQ(cj["text_config"]["model_type"], "kimi_linear");
  EXPECT_EQ(cj["text_config"]["quantization_config"]["format"], "mxfp4-pack-quantized");
  EXPECT_EQ(cj["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"], 32);
  EXPECT_FALSE(cj.contains("vision_config"));  // no vision tensors written
  EXPECT_EQ(cj["eos_token_id"], 290);
  const K3Config back = load_config(t.sub("mx") + "/config.json");
  EXPECT_TRUE(back.quantization.present);
  EXPECT_FALSE(back.vision.present);
  // The saved model reads back to the same weights.
  Loaded again = load_logged(t.sub("mx"));
  EXPECT_TRUE(again.log.empty());
  EXPECT_TRUE(same_dense(l.model.weights(), again.model.weights()));

  save_checkpoint(t.sub("plain"), l.model.weights());  // plain experts: no quantization_config
  nlohmann::json pj = nlohmann::json::parse(slurp(t.sub("plain") + "/config.json"));
  EXPECT_FALSE(pj["text_config"].contains("quantization_config"));
}

TEST(ReleaseLayout, GeneratorReproducesTheCommittedFixture) {
  const char* py = "/usr/bin/python3";
  if (::access(py, X_OK) != 0) GTEST_SKIP() << py << " is not installed";
  TempDir t;
  const std::string cmd = std::string(py) + " -B " + K3_SOURCE_DIR + "/tools/make_release_fixture.py --out " + t.sub("gen") +
                          " 2>&1";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << cmd;
  std::vector<std::string> committed, generated;
  for (const auto& e : fs::directory_iterator(kReleaseTiny)) committed.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(t.sub("gen"))) generated.push_back(e.path().filename().string());
  std::sort(committed.begin(), committed.end());
  std::sort(generated.begin(), generated.end());
  ASSERT_EQ(committed, generated);
  uint64_t total = 0;
  for (const std::string& f : committed) {
    const std::string a = slurp(kReleaseTiny + "/" + f), b = slurp(t.sub("gen") + "/" + f);
    EXPECT_TRUE(a == b) << f << " differs from what tools/make_release_fixture.py writes (" << a.size() << " vs "
                        << b.size() << " bytes): regenerate it with the script";
    total += a.size();
  }
  EXPECT_LT(total, uint64_t(1) << 20);  // the fixture stays small
}
