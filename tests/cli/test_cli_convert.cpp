// `k3cpp convert`, run as the built binary: a plain-expert f32 model becomes an MXFP4 / bf16
// directory (the vocabulary file copied, the experts stored as weight_packed + weight_scale)
// whose logits stay close to the original's and which runs under --ram-budget (that needs
// MXFP4 experts: the original is refused); converting back to plain f32 gives the MXFP4
// copy's logits exactly; bad arguments fail with one clear line and leave no directory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "io/atomic_file.h"
#include "io/config.h"

using namespace k3;
using k3::test::RunResult;
using k3::test::slurp;

namespace {

using k3::test::q;
using k3::test::k3cpp;
using k3::test::has;

std::vector<float> floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

}  // namespace

TEST(CliConvert, PlainToMxfp4RunsUnderABudgetAndBackIsExact) {
  k3::test::TempDir t("k3_cli_convert");
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.num_hidden_layers = 4;
  c.full_attn_layers = {2, 4};
  c.kda_layers = {1, 3};
  c.moe_intermediate_size = 64;
  c.attn_res_block_size = 2;
  c.vocab_size = 260;
  const std::string cfg = t.sub("cfg.json"), plain = t.sub("plain"), mx = t.sub("mx"), back = t.sub("back");
  write_text_file_atomic(cfg, config_to_hf_json(c));
  RunResult r = k3cpp("init " + q(cfg) + " " + q(plain) + " --seed 3");
  ASSERT_EQ(r.rc, 0) << r.err;
  r = k3cpp("convert " + q(plain) + " " + q(mx));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "experts mxfp4")) << r.out;
  EXPECT_EQ(slurp(plain + "/tokenizer.json"), slurp(mx + "/tokenizer.json"));
  r = k3cpp("inspect " + q(mx));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "weight_packed")) << r.out;

  const std::string ids = " --ids 1,7,42,100,3,9 --logits ";
  ASSERT_EQ(k3cpp("forward " + q(plain) + ids + q(t.sub("p.f32"))).rc, 0);
  ASSERT_EQ(k3cpp("forward " + q(mx) + ids + q(t.sub("m.f32"))).rc, 0);
  const std::vector<float> lp = floats(slurp(t.sub("p.f32"))), lm = floats(slurp(t.sub("m.f32")));
  ASSERT_EQ(lp.size(), lm.size());
  ASSERT_FALSE(lp.empty());
  double num = 0, den = 0;
  for (size_t i = 0; i < lp.size(); ++i) num += (lp[i] - lm[i]) * (lp[i] - lm[i]), den += lp[i] * lp[i];
  EXPECT_GT(num, 0) << "the MXFP4 copy computes exactly the f32 model: nothing was quantised";
  EXPECT_LT(std::sqrt(num / den), 0.05) << "MXFP4 + bf16 moved the logits too far";

  // Memory-limited inference takes the converted directory (the plain one is refused).
  r = k3cpp("forward " + q(plain) + ids + q(t.sub("x.f32")) + " --ram-budget 1");
  EXPECT_NE(r.rc, 0);
  r = k3cpp("forward " + q(mx) + ids + q(t.sub("b.f32")) + " --ram-budget 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(slurp(t.sub("b.f32")) == slurp(t.sub("m.f32")));

  // Back to plain f32: MXFP4 and bf16 values widen exactly, so the logits are the MXFP4 copy's.
  r = k3cpp("convert " + q(mx) + " " + q(back) + " --experts plain --dtype f32");
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(k3cpp("forward " + q(back) + ids + q(t.sub("k.f32"))).rc, 0);
  const std::vector<float> lk = floats(slurp(t.sub("k.f32")));
  ASSERT_EQ(lk.size(), lm.size());
  double worst = 0;
  for (size_t i = 0; i < lk.size(); ++i) worst = std::max(worst, double(std::fabs(lk[i] - lm[i])));
  EXPECT_LT(worst, 1e-4);
}

TEST(CliConvert, BadArgumentsFailClearlyAndWriteNothing) {
  k3::test::TempDir t("k3_cli_convert_bad");
  RunResult r = k3cpp("convert " + q(t.sub("missing")) + " " + q(t.sub("o")));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "missing")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(t.sub("o")));
  const std::string fixture = std::string(K3_SOURCE_DIR) + "/tests/data/k3-release-tiny";
  r = k3cpp("convert " + q(fixture) + " " + q(t.sub("o")) + " --experts fp8");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--experts")) << r.err;
  r = k3cpp("convert " + q(fixture) + " " + q(fixture));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "model directory itself")) << r.err;
  std::filesystem::create_directories(t.sub("full"));
  write_text_file_atomic(t.sub("full/keep.txt"), "x");
  r = k3cpp("convert " + q(fixture) + " " + q(t.sub("full")));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--force")) << r.err;
  EXPECT_EQ(slurp(t.sub("full/keep.txt")), "x");
}
