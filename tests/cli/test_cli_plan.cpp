// `k3cpp plan` and `k3cpp inspect`, run as the built binary (K3_CLI_PATH): printed K3
// figures (2.78 T total, 104.2 B active, docs/model.md section 1) and exit codes; bad configs
// and options refused with the field named on stderr; configs/README.md agrees with plan.
// inspect: a zero-filled checkpoint for configs/tiny.json written with
// write_checkpoint_shards passes; one tensor missing / wrong shape / wrong dtype / extra /
// bad MXFP4 part each fails with the tensor named.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cli_run.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/param_specs.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using k3::test::has;
using k3::test::k3cpp;
using k3::test::RunResult;
using k3::test::slurp;
using k3::test::TempDir;

std::string src(const std::string& rel) { return std::string("'") + K3_SOURCE_DIR + "/" + rel + "'"; }

}  // namespace

TEST(CliPlan, K3Figures) {
  RunResult r = k3cpp("plan " + src("configs/kimi-k3.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "2.78 T")) << r.out;
  EXPECT_TRUE(has(r.out, "104.2 B")) << r.out;
  EXPECT_TRUE(has(r.out, "2779484476000")) << r.out;
  EXPECT_TRUE(has(r.out, "104189612640")) << r.out;
  EXPECT_TRUE(has(r.out, "routed_experts")) << r.out;
  EXPECT_TRUE(has(r.out, "storage mxfp4")) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(CliPlan, JsonAndPlacement) {
  RunResult r = k3cpp("plan " + src("configs/kimi-k3.json") +
                      " --json --storage bf16 --context 131072 --batch 64 --gpus 64 --gpu-mem 141");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["parameters"]["total"].get<int64_t>(), 2779484476000LL);
  EXPECT_EQ(j["parameters"]["active"].get<int64_t>(), 104189612640LL);
  EXPECT_EQ(j["parameters"]["components"]["embedding"]["active"].get<int64_t>(), 0);
  EXPECT_EQ(j["weights"]["storage"], "bf16");
  EXPECT_EQ(j["weights"]["total_bytes"].get<uint64_t>(), 2ULL * 2779484476000ULL);
  EXPECT_EQ(j["cache"]["context"].get<int64_t>(), 131072);
  EXPECT_EQ(j["placement"]["experts_per_device"].get<int64_t>(), 14);
  EXPECT_FALSE(j["placement"]["fits"].get<bool>());  // bf16 experts: ~84 GiB per device on top of the rest
  EXPECT_GT(j["flops_per_token"]["total"].get<double>(), 2.0e11);

  r = k3cpp("plan " + src("configs/kimi-k3.json") + " --context 131072 --batch 64 --gpus 64 --gpu-mem 141");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "placement on 64 GPUs")) << r.out;
  EXPECT_TRUE(has(r.out, ": fits")) << r.out;
}

// --device-gib: one device holds mid-1024, the full K3 needs expert parallelism over the fewest
// devices whose count divides 896 (the replicated bf16 trunk, 105.7 GiB, stays on every device), and at 80 GiB the replicated part alone does not fit.
TEST(CliPlan, DeviceMemory) {
  RunResult r = k3cpp("plan " + src("configs/mid-1024.json") + " --device-gib 139.8");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "one device of 139.8 GiB")) << r.out;
  EXPECT_TRUE(has(r.out, ": fits")) << r.out;
  r = k3cpp("plan " + src("configs/kimi-k3.json") + " --device-gib 139.8 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_FALSE(j["device"]["fits_one"].get<bool>());
  const int64_t n = j["device"]["fewest_expert_parallel_devices"].get<int64_t>();
  EXPECT_EQ(n, 56);
  EXPECT_EQ(896 % n, 0);
  r = k3cpp("plan " + src("configs/kimi-k3.json") + " --device-gib 80");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "no number of devices of 80 GiB holds it")) << r.out;
  r = k3cpp("plan " + src("configs/kimi-k3.json") + " --device-gib -3");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "--device-gib")) << r.err;
}

TEST(CliPlan, BadConfigNamesField) {
  RunResult r = k3cpp("plan " + src("tests/data/k3-fixtures/cfg/bad_topk.json"));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "bad_topk.json")) << r.err;
  EXPECT_TRUE(has(r.err, "num_experts_per_token")) << r.err;
  r = k3cpp("plan " + src("tests/data/k3-fixtures/cfg/no_layermap.json"));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "full_attn_layers")) << r.err;
  r = k3cpp("plan /nonexistent/config.json");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "/nonexistent/config.json")) << r.err;
}

TEST(CliPlan, BadOptionsRefused) {
  const std::string cfg = src("configs/tiny.json");
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : std::vector<Case>{{"--storage fp8", "storage"},
                                         {"--gpus 0 --gpu-mem 80", "--gpus"},
                                         {"--gpus -2 --gpu-mem 80", "--gpus"},
                                         {"--gpus 4", "--gpu-mem"},
                                         {"--gpus 4 --gpu-mem 0", "--gpu-mem"},
                                         {"--context 0", "--context"},
                                         {"--batch -1", "--batch"},
                                         {"--bogus", "--bogus"}}) {
    RunResult r = k3cpp("plan " + cfg + " " + c.args);
    EXPECT_EQ(r.rc, 1) << c.args;
    EXPECT_TRUE(has(r.err, c.needle)) << c.args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
  EXPECT_NE(k3cpp("plan").rc, 0);
}

TEST(CliPlan, ReadmeAgreesWithPlan) {
  const std::string readme = slurp(std::string(K3_SOURCE_DIR) + "/configs/README.md");
  for (const char* f : {"kimi-k3.json", "mid-1024.json", "small-896.json", "tiny.json"}) {
    RunResult r = k3cpp(std::string("plan --json ") + src(std::string("configs/") + f));
    ASSERT_EQ(r.rc, 0) << f << r.err;
    json j = json::parse(r.out);
    EXPECT_TRUE(has(readme, "`" + std::string(f) + "`")) << f;
    EXPECT_TRUE(has(readme, "(" + std::to_string(j["parameters"]["total"].get<int64_t>()) + ")")) << f;
    EXPECT_TRUE(has(readme, "(" + std::to_string(j["parameters"]["active"].get<int64_t>()) + ")")) << f;
  }
}

// ---- inspect -------------------------------------------------------------------------

namespace {

using Tensors = std::vector<std::pair<std::string, k3::Tensor>>;

// Zero tensors for every spec of `c`: bf16, except routed experts' w1 which are stored
// MXFP4 (packed + scale) so that both accepted forms are exercised.
Tensors tiny_checkpoint(const k3::K3Config& c) {
  Tensors t;
  for (const k3::ParamSpec& s : k3::k3_param_specs(c)) {
    const bool mx = s.component == k3::Component::RoutedExperts && s.name.find(".w1.") != std::string::npos;
    for (const k3::StoredTensor& st :
         k3::stored_tensors(s, mx ? k3::ExpertStorage::Mxfp4 : k3::ExpertStorage::Plain, k3::DType::BF16))
      t.emplace_back(st.name, k3::Tensor::zeros(st.dtype, st.shape));
  }
  return t;
}

k3::K3Config tiny() { return k3::load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json"); }

void write(const std::string& dir, const Tensors& t) { k3::write_checkpoint_shards(dir, t, 1 << 20); }

Tensors::iterator find(Tensors& t, const std::string& name) {
  for (auto it = t.begin(); it != t.end(); ++it)
    if (it->first == name) return it;
  ADD_FAILURE() << "no tensor " << name;
  return t.end();
}

// Writes `mutate(tiny checkpoint)` and runs inspect with the tiny config.
RunResult inspect_mutated(const std::function<void(Tensors&)>& mutate, const std::string& extra_args = "") {
  TempDir d;
  Tensors t = tiny_checkpoint(tiny());
  mutate(t);
  write(d.path, t);
  return k3cpp("inspect '" + d.path + "' --config " + src("configs/tiny.json") + " " + extra_args);
}

}  // namespace

TEST(CliInspect, CompleteCheckpointPasses) {
  RunResult r = inspect_mutated([](Tensors&) {});
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "OK")) << r.out;
  EXPECT_TRUE(has(r.out, "layer 12")) << r.out;
  EXPECT_TRUE(has(r.out, "routed_experts")) << r.out;
  EXPECT_TRUE(has(r.out, k3::layer_prefix(1) + "block_sparse_moe.experts.0.w1.weight_packed")) << r.out;
  EXPECT_TRUE(has(r.out, "[48, 32]")) << r.out;
  EXPECT_FALSE(has(r.out, "missing")) << r.out;
  EXPECT_FALSE(has(r.out, "unexpected")) << r.out;
}

TEST(CliInspect, DefaultConfigBesideCheckpoint) {
  TempDir d;
  write(d.path, tiny_checkpoint(tiny()));
  std::ofstream(d.path + "/config.json") << k3::config_to_hf_json(tiny());
  RunResult r = k3cpp("inspect '" + d.path + "' --summary");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "check against " + d.path + "/config.json")) << r.out;
  EXPECT_FALSE(has(r.out, "embed_tokens")) << "--summary lists no tensors";
  // --no-config lists only.
  r = k3cpp("inspect '" + d.path + "' --no-config");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "no config")) << r.out;
  EXPECT_TRUE(has(r.out, "embed_tokens")) << r.out;
  EXPECT_TRUE(has(r.out, "  routed_experts       32 tensor(s)")) << r.out;  // grouped without a config
  EXPECT_TRUE(has(r.out, "  mla                   8 tensor(s)")) << r.out;   // o_proj/g_proj of MLA layers
  // A bad config is refused with its field named.
  r = k3cpp("inspect '" + d.path + "' --config " + src("tests/data/k3-fixtures/cfg/bad_layer_index.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "full_attn_layers")) << r.err;
}

TEST(CliInspect, MissingTensorReported) {
  const std::string name = k3::layer_prefix(5) + "self_attn.q_proj.weight";
  RunResult r = inspect_mutated([&](Tensors& t) { t.erase(find(t, name)); });
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, "missing    " + name)) << r.out;
  EXPECT_TRUE(has(r.out, "1 missing, 0 unexpected, 0 shape/dtype")) << r.out;
}

TEST(CliInspect, WrongShapeReported) {
  const std::string name = k3::layer_prefix(3) + "self_attn.q_a_proj.weight";
  RunResult r = inspect_mutated([&](Tensors& t) { find(t, name)->second = k3::Tensor::zeros(k3::DType::BF16, {64, 127}); });
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, "shape      " + name + ": expected [64, 128], found [64, 127]")) << r.out;
}

TEST(CliInspect, WrongDtypeReported) {
  const std::string name = k3::layer_prefix(0) + "mlp.up_proj.weight";
  RunResult r = inspect_mutated([&](Tensors& t) { find(t, name)->second = k3::Tensor::zeros(k3::DType::I32, {96, 128}); });
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, "dtype      " + name)) << r.out;
}

TEST(CliInspect, ExtraTensorReported) {
  const std::string name = k3::layer_prefix(0) + "self_attn.extra_thing.weight";
  RunResult r = inspect_mutated([&](Tensors& t) { t.emplace_back(name, k3::Tensor::zeros(k3::DType::BF16, {3})); });
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, "unexpected " + name)) << r.out;
  EXPECT_TRUE(has(r.out, "0 missing, 1 unexpected")) << r.out;
}

TEST(CliInspect, Mxfp4PartsChecked) {
  const std::string w1 = k3::layer_prefix(2) + "block_sparse_moe.experts.1.w1.weight";
  // Wrong packed shape.
  RunResult r = inspect_mutated(
      [&](Tensors& t) { find(t, w1 + "_packed")->second = k3::Tensor::zeros(k3::DType::U8, {48, 64}); });
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, "shape      " + w1 + "_packed: expected [48, 32]")) << r.out;
  // Scale missing.
  r = inspect_mutated([&](Tensors& t) { t.erase(find(t, w1 + "_scale")); });
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, "missing    " + w1 + "_scale")) << r.out;
  // Both plain and MXFP4.
  r = inspect_mutated([&](Tensors& t) { t.emplace_back(w1, k3::Tensor::zeros(k3::DType::BF16, {48, 64})); });
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.out, w1 + ": stored both plain and as MXFP4")) << r.out;
}

TEST(CliInspect, MissingCheckpointIsAnError) {
  RunResult r = k3cpp("inspect /nonexistent/ckpt --no-config");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "/nonexistent/ckpt")) << r.err;
}
