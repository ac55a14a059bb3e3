// `--ram-budget` on forward / generate, run as the built binary: forward's logits file is
// byte-identical to the resident run's (both cache policies, O_DIRECT and buffered reads),
// generate prints the same greedy tokens, the plan, stream and memory lines are printed,
// an impossible budget fails with one line naming --ram-budget and the minimum, and the
// companion options are refused without a budget; `k3cpp plan --ram-budget --disk-gbps`
// prints the projection.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

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

// A 4-layer MXFP4-compatible config (expert width 64), bf16 dense weights, MXFP4 experts.
std::string make_model(const k3::test::TempDir& t) {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.num_hidden_layers = 4;
  c.full_attn_layers = {2, 4};
  c.kda_layers = {1, 3};
  c.moe_intermediate_size = 64;
  c.attn_res_block_size = 2;
  c.vocab_size = 8192;
  const std::string cfg = t.sub("cfg.json"), dir = t.sub("m");
  write_text_file_atomic(cfg, config_to_hf_json(c));
  const RunResult r = k3cpp("init " + q(cfg) + " " + q(dir) + " --seed 5 --experts mxfp4 --dtype bf16");
  EXPECT_EQ(r.rc, 0) << r.err;
  return dir;
}

// 13 layers 512 wide (configs/tiny.json otherwise), bf16: a trunk of ~12 MB against two
// layers of ~1 MB, so a budget between the ring's minimum and the resident one exists, and a
// vocabulary of 8192 (an embedding and lm_head of 16.8 MB), so that at the minimum they are
// streamed.
std::string make_wide_model(const k3::test::TempDir& t) {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.hidden_size = 512;
  c.moe_intermediate_size = 64;
  c.vocab_size = 8192;
  const std::string cfg = t.sub("wide.json"), dir = t.sub("w");
  write_text_file_atomic(cfg, config_to_hf_json(c));
  const RunResult r = k3cpp("init " + q(cfg) + " " + q(dir) + " --seed 7 --experts mxfp4 --dtype bf16");
  EXPECT_EQ(r.rc, 0) << r.err;
  return dir;
}

// The number after `key` in `s` (0 if absent).
double number_after(const std::string& s, const std::string& key) {
  const size_t p = s.find(key);
  return p == std::string::npos ? 0 : std::atof(s.c_str() + p + key.size());
}

}  // namespace

TEST(CliRamBudget, ABudgetBelowTheTrunkStreamsItAndEqualsTheResidentRun) {
  k3::test::TempDir t("k3_cli_ring");
  const std::string dir = make_wide_model(t);
  const std::string ids = "1,7,42,100,3,9";
  const std::string fwd = "forward " + q(dir) + " --ids " + ids + " --logits ";
  // The minimum with the trunk streamed and the resident one, from the refusal of a tiny budget.
  const RunResult no = k3cpp(fwd + q(t.sub("x.f32")) + " --disk-gbps 1 --ram-budget 0.001");
  ASSERT_NE(no.rc, 0);
  const double ring_min = number_after(no.err, "below the minimum of "),
               resident = number_after(no.err, "the whole trunk resident would need ");
  ASSERT_GT(ring_min, 0) << no.err;
  ASSERT_GT(resident - ring_min, 0.004) << no.err;
  char budget[32];
  std::snprintf(budget, sizeof budget, "%.4f", (ring_min + resident) / 2);
  ASSERT_EQ(k3cpp(fwd + q(t.sub("res.f32"))).rc, 0);
  const RunResult f = k3cpp(fwd + q(t.sub("s.f32")) + " --disk-gbps 1 --ram-budget " + budget);
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_EQ(slurp(t.sub("s.f32")), slurp(t.sub("res.f32")));
  EXPECT_TRUE(has(f.err, "dense trunk streamed")) << f.err;
  EXPECT_TRUE(has(f.err, "trunk ring: ")) << f.err;
  const std::string gen = "generate " + q(dir) + " --ids " + ids + " --max-tokens 5 --ids-out";
  const RunResult g0 = k3cpp(gen), g1 = k3cpp(gen + " --disk-gbps 1 --ram-budget " + budget);
  ASSERT_EQ(g0.rc, 0) << g0.err;
  ASSERT_EQ(g1.rc, 0) << g1.err;
  EXPECT_EQ(g1.out, g0.out);
  EXPECT_TRUE(has(g1.err, "trunk streamed through a ring of")) << g1.err;
  EXPECT_TRUE(has(g1.err, "generate: decode: 4 tokens") && has(g1.err, "trunk read ")) << g1.err;
  // Just above the minimum (printed to 1 MB; holding the embedding and lm_head would need 8 MB
  // more): they are streamed, and the logits still equal the resident run's.
  std::snprintf(budget, sizeof budget, "%.4f", ring_min + 0.002);
  const RunResult m = k3cpp(fwd + q(t.sub("m.f32")) + " --disk-gbps 1 --ram-budget " + budget);
  ASSERT_EQ(m.rc, 0) << m.err;
  EXPECT_EQ(slurp(t.sub("m.f32")), slurp(t.sub("res.f32")));
  EXPECT_TRUE(has(m.err, "embedding and lm_head streamed")) << m.err;
  EXPECT_TRUE(has(m.err, "head stream: 6 embedding rows read")) << m.err;
  EXPECT_TRUE(has(m.err, "under")) << m.err;  // peak RssAnon against the budget
}

TEST(CliRamBudget, ForwardAndGenerateEqualTheResidentRun) {
  k3::test::TempDir t("k3_cli_budget");
  const std::string dir = make_model(t);
  const std::string ids = "1,7,42,100,3,9,250,17,5";
  ASSERT_EQ(k3cpp("forward " + q(dir) + " --ids " + ids + " --logits " + q(t.sub("res.f32"))).rc, 0);
  const std::string want = slurp(t.sub("res.f32"));
  ASSERT_FALSE(want.empty());
  for (const char* extra :
       {"--cache-policy s3fifo --io direct", "--cache-policy lru --io buffered", "--io direct --trunk-slots 2"}) {
    const RunResult r = k3cpp("forward " + q(dir) + " --ids " + ids + " --logits " + q(t.sub("s.f32")) +
                              " --ram-budget 0.2 --disk-gbps 1 " + extra);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(slurp(t.sub("s.f32")), want) << extra;
    EXPECT_TRUE(has(r.err, "plan: budget 0.20 GB")) << r.err;
    EXPECT_TRUE(has(r.err, "routed experts streamed")) << r.err;
    EXPECT_TRUE(has(r.err, "stream: ")) << r.err;
    EXPECT_TRUE(has(r.err, "peak RssAnon")) << r.err;
    EXPECT_TRUE(has(r.err, std::string(extra).find("direct") != std::string::npos ? "O_DIRECT" : "buffered")) << r.err;
  }
  const RunResult g0 = k3cpp("generate " + q(dir) + " --ids " + ids + " --max-tokens 6 --ids-out");
  const RunResult g1 = k3cpp("generate " + q(dir) + " --ids " + ids + " --max-tokens 6 --ids-out --ram-budget 0.2");
  ASSERT_EQ(g0.rc, 0) << g0.err;
  ASSERT_EQ(g1.rc, 0) << g1.err;
  EXPECT_EQ(g1.out, g0.out);
  EXPECT_TRUE(has(g1.err, "generate: decode: 5 tokens")) << g1.err;
  EXPECT_TRUE(has(g1.err, "disk: ")) << g1.err;  // measured when --disk-gbps is not given
}

TEST(CliRamBudget, BadBudgetsAndOptionsFailClearly) {
  k3::test::TempDir t("k3_cli_budget");
  const std::string dir = make_model(t);
  const std::string fwd = "forward " + q(dir) + " --ids 1,2 --logits " + q(t.sub("l.f32"));
  RunResult r = k3cpp(fwd + " --ram-budget 0.001");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--ram-budget") && has(r.err, "below the minimum")) << r.err;
  r = k3cpp(fwd + " --ram-budget -3");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--ram-budget")) << r.err;
  r = k3cpp(fwd + " --cache-policy lru");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "only with --ram-budget")) << r.err;
  r = k3cpp(fwd + " --ram-budget 1 --cache-policy lfu");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--cache-policy")) << r.err;
}

TEST(CliRamBudget, PlanProjectsTheFullK3) {
  const std::string k3 = q(std::string(K3_SOURCE_DIR) + "/configs/kimi-k3.json");
  RunResult r = k3cpp("plan " + k3 + " --ram-budget 8 --disk-gbps 7");
  ASSERT_EQ(r.rc, 0) << r.err;
  // The bf16 trunk (~110 GB) does not fit 8 GB, nor its embedding and lm_head (4.7 GB) beside
  // a ring of two slots for the dense first layer (2.3 GB each) and the working memory: they
  // are streamed (the lm_head read in blocks once per call) and 8 GB runs.
  EXPECT_FALSE(has(r.out, "below the minimum")) << r.out;
  EXPECT_TRUE(has(r.out, "trunk streamed through a ring of 2 slots")) << r.out;
  EXPECT_TRUE(has(r.out, "embedding and lm_head streamed")) << r.out;
  EXPECT_TRUE(has(r.out, "2.35 GB read per call")) << r.out;
  r = k3cpp("plan " + k3 + " --ram-budget 8 --disk-gbps 7 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\"fits\": true")) << r.out;
  EXPECT_TRUE(has(r.out, "\"head_streamed\": true")) << r.out;
  // Below even a one-slot ring with the head streamed (about 4.1 GB), the minimum is named.
  r = k3cpp("plan " + k3 + " --ram-budget 4 --disk-gbps 7");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "below the minimum")) << r.out;
  EXPECT_TRUE(has(r.out, "trunk streamed through a ring of 1 slot")) << r.out;
  r = k3cpp("plan " + k3 + " --ram-budget 12 --disk-gbps 7");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "trunk streamed through a ring of 2 slots")) << r.out;
  // Room for layers beyond the ring: a prefix of them pinned (held, never read).
  EXPECT_TRUE(has(r.out, "leading layers pinned")) << r.out;
  r = k3cpp("plan " + k3 + " --ram-budget 256 --disk-gbps 7 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\"decode_bytes_per_token\"")) << r.out;
  EXPECT_TRUE(has(r.out, "\"fits\": true")) << r.out;
  r = k3cpp("plan " + k3 + " --ram-budget 8");
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(has(r.err, "--disk-gbps")) << r.err;
}
