// The released checkpoint layout through the built binary (K3_CLI_PATH), on
// tests/data/k3-release-tiny (tools/make_release_fixture.py):
//  - `k3cpp inspect --config` reports it clean, naming the skipped vision tensors in one line;
//  - `k3cpp forward` runs on it, and its log says the vision tensors were skipped in ONE line;
//  - a copy under the pre-release names (final_res_*) loads and inspects with a notice;
//  - an A_log with non-zero padding, an unknown quantization method: non-zero exit, one line
//    naming the file and the tensor or field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/fixture.h"
#include "io/safetensors.h"
#include "model/param_specs.h"

namespace fs = std::filesystem;
using namespace k3;
using k3::test::RunResult;

namespace {

using k3::test::kReleaseTiny;

const std::string kALog1 = layer_prefix(1) + "self_attn.A_log";

using k3::test::q;
using k3::test::k3cpp;
using k3::test::has;
int64_t lines_with(const std::string& text, const std::string& sub) {
  int64_t n = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.substr(start, end - start).find(sub) != std::string::npos) ++n;
    start = end + 1;
  }
  return n;
}

// The fixture's tensors, each passed through `edit` (which may rename or replace it), in one
// model.safetensors beside the fixture's config.json.
template <typename Edit>
std::string rewrite(const k3::test::TempDir& t, const std::string& name, Edit edit) {
  const CheckpointReader ck = CheckpointReader::open(kReleaseTiny);
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const std::string& n : ck.names()) {
    std::string nn = n;
    Tensor x = ck.get(n);
    edit(nn, x);
    ts.emplace_back(nn, x);
  }
  const std::string dir = t.sub(name);
  fs::create_directories(dir);
  fs::copy_file(kReleaseTiny + "/config.json", dir + "/config.json");
  write_checkpoint_shards(dir, ts, uint64_t(1) << 40);
  return dir;
}

}  // namespace

TEST(CliRelease, InspectReportsTheReleasedLayoutClean) {
  RunResult r = k3cpp("inspect " + q(kReleaseTiny) + " --config " + q(kReleaseTiny + "/config.json"));
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "OK: every tensor present")) << r.out;
  EXPECT_EQ(lines_with(r.out, "skipped 18 vision tensor(s)"), 1) << r.out;
  EXPECT_FALSE(has(r.out, "unexpected ")) << r.out;
  EXPECT_TRUE(has(r.out, "vision (skipped)")) << r.out;  // listed, in their own group
  EXPECT_TRUE(has(r.out, "language_model.model.output_attn_res_proj.weight")) << r.out;
}

TEST(CliRelease, ForwardRunsAndLogsTheSkippedVisionTensorsOnce) {
  k3::test::TempDir t("k3_cli_release");
  const std::string logits = t.sub("logits.f32");
  RunResult r = k3cpp("forward " + q(kReleaseTiny) + " --ids 288,10,100,290 --logits " + q(logits));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(lines_with(r.err, "vision"), 1) << r.err;
  EXPECT_TRUE(has(r.err, "vision_tower.*: 15, mm_projector.*: 3")) << r.err;
  EXPECT_EQ(fs::file_size(logits), uint64_t(4 * 544 * sizeof(float)));
}

TEST(CliRelease, PreReleaseNamesLoadWithANotice) {
  k3::test::TempDir t("k3_cli_release");
  const std::string dir = rewrite(t, "old", [](std::string& n, Tensor&) {
    if (const std::string old = legacy_param_name(n); !old.empty()) n = old;
  });
  RunResult f = k3cpp("forward " + q(dir) + " --ids 1,2 --logits " + q(t.sub("l.f32")));
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_EQ(lines_with(f.err, "final_res_norm.weight"), 1) << f.err;
  // Same logits as the release-named original.
  RunResult g = k3cpp("forward " + q(kReleaseTiny) + " --ids 1,2 --logits " + q(t.sub("r.f32")));
  ASSERT_EQ(g.rc, 0) << g.err;
  EXPECT_EQ(k3::test::slurp(t.sub("l.f32")), k3::test::slurp(t.sub("r.f32")));
  RunResult i = k3cpp("inspect " + q(dir) + " --summary");
  EXPECT_EQ(i.rc, 0) << i.out;
  EXPECT_TRUE(has(i.out, "note: read final_res_norm.weight, final_res_proj.weight")) << i.out;
}

TEST(CliRelease, BadReleasedInputsFailInOneLine) {
  k3::test::TempDir t("k3_cli_release");
  auto expect_fail = [](const std::string& args, const std::vector<std::string>& pieces) {
    RunResult r = k3cpp(args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line expected: " << r.err;
    for (const std::string& p : pieces) EXPECT_TRUE(has(r.err, p)) << "'" << p << "' not in: " << r.err;
  };
  const std::string pad = rewrite(t, "pad", [](std::string& n, Tensor& x) {
    if (n != kALog1) return;
    x = x.clone();
    x.data<float>()[15] = -1.0f;
  });
  expect_fail("forward " + q(pad) + " --ids 1 --logits " + q(t.sub("l")),
              {pad + "/model.safetensors", kALog1, "not zero", "entry 15 = -1"});
  RunResult i = k3cpp("inspect " + q(pad));
  EXPECT_EQ(i.rc, 1);
  EXPECT_EQ(lines_with(i.out, "padding    "), 1) << i.out;
  EXPECT_TRUE(has(i.out, kALog1)) << i.out;

  // An unknown quantization method in config.json.
  const std::string qdir = t.sub("quant");
  fs::create_directories(qdir);
  nlohmann::json cj = nlohmann::json::parse(k3::test::slurp(kReleaseTiny + "/config.json"));
  cj["text_config"]["quantization_config"]["quant_method"] = "awq";
  std::ofstream(qdir + "/config.json") << cj.dump(2);
  for (const auto& e : fs::directory_iterator(kReleaseTiny))
    if (e.path().filename() != "config.json") fs::copy_file(e.path(), qdir + "/" + e.path().filename().string());
  expect_fail("forward " + q(qdir) + " --ids 1 --logits " + q(t.sub("l")),
              {qdir + "/config.json", "text_config.quantization_config.quant_method", "awq"});
  expect_fail("inspect " + q(qdir), {"config.json", "quant_method", "awq"});
}
