// `k3cpp eval --task ...` (cli/cmd_eval_long.cpp) on the released-layout tiny model with its
// K3 tokenizer: the grid and the memory table reach the JSON (state bytes equal the formula,
// accuracies are fractions), loss-by-position writes one curve per length, and bad options
// fail with a message naming them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/cli_run.h"
#include "common/fixture.h"

using namespace k3;

namespace {

const std::string kModel = std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny";

TEST(CliEvalLong, PasskeyGridAndMemoryTable) {
  test::TempDir tmp;
  const test::RunResult r = test::run_k3cpp("eval " + kModel +
                                            " --task passkey --lengths 200,400 --depths 0,1 --samples 2 --chunk 128"
                                            " --threads 1 --json " + tmp.sub("pk.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("passkey accuracy"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(test::slurp(tmp.sub("pk.json")));
  ASSERT_EQ(j["accuracy"].size(), 2u);
  ASSERT_EQ(j["accuracy"][0].size(), 2u);
  for (const auto& row : j["accuracy"])
    for (const auto& v : row) EXPECT_TRUE(v.get<double>() >= 0 && v.get<double>() <= 1);
  ASSERT_EQ(j["memory"].size(), 2u);
  for (const auto& m : j["memory"]) {
    EXPECT_EQ(m["state_bytes"], m["state_formula_bytes"]);
    EXPECT_GT(m["prefill_tok_s"].get<double>(), 0);
  }
  EXPECT_GT(j["memory"][1]["state_bytes"].get<int64_t>(), j["memory"][0]["state_bytes"].get<int64_t>());
  EXPECT_NE(j["vocabulary"].get<std::string>().find("tiktoken"), std::string::npos);
}

TEST(CliEvalLong, LossByPositionCurves) {
  test::TempDir tmp;
  const test::RunResult r = test::run_k3cpp("eval " + kModel +
                                            " --task loss-by-position --lengths 300 --bucket 100 --chunk 64"
                                            " --threads 1 --json " + tmp.sub("lp.json"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(test::slurp(tmp.sub("lp.json")));
  ASSERT_EQ(j["curves"].size(), 1u);
  EXPECT_EQ(j["curves"][0]["loss_nats"].size(), 3u);
  for (const auto& v : j["curves"][0]["loss_nats"]) EXPECT_GT(v.get<double>(), 0);
}

// --attn-logn 100 (an extrapolation option, not K3): the MLA layer's queries past position 99
// are scaled, so the first bucket's loss is the plain run's bit for bit and the later ones move.
TEST(CliEvalLong, AttnLognLeavesPositionsWithinItsBaseAndMovesTheRest) {
  test::TempDir tmp;
  auto curve = [&](const std::string& extra, const std::string& name) {
    const test::RunResult r = test::run_k3cpp("eval " + kModel + " --task loss-by-position --lengths 300 --bucket 100" +
                                              " --chunk 64 --threads 1" + extra + " --json " + tmp.sub(name));
    EXPECT_EQ(r.rc, 0) << r.err;
    return nlohmann::json::parse(test::slurp(tmp.sub(name)));
  };
  const nlohmann::json off = curve("", "off.json"), on = curve(" --attn-logn 100", "on.json");
  EXPECT_FALSE(off.contains("attn_logn"));
  EXPECT_EQ(on["attn_logn"], 100);
  const auto &a = off["curves"][0]["loss_nats"], &b = on["curves"][0]["loss_nats"];
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a[0].get<double>(), b[0].get<double>());
  EXPECT_NE(a[2].get<double>(), b[2].get<double>());
}

TEST(CliEvalLong, BadOptionsNameThemselves) {
  for (const auto& [args, what] : std::vector<std::pair<std::string, std::string>>{
           {"--task needle", "--task"},
           {"--task passkey --lengths 1X", "--lengths"},
           {"--task passkey --depths 2", "--depths"},
           {"--task passkey --attn-logn 1", "--attn-logn"},
           {"--task passkey --attn-logn -5", "--attn-logn"},
           {"--task vartrack --lengths 30", "cannot hold"}}) {
    const test::RunResult r = test::run_k3cpp("eval " + kModel + " " + args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_NE(r.err.find(what), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace
