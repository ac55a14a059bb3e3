// `k3cpp chat` through the built binary (K3_CLI_PATH) on the released-layout fixture
// (tests/data/k3-release-tiny: random weights, a tiny K3-layout tiktoken vocabulary):
//  - one turn with --prompt: exit 0, the per-turn line on stderr;
//  - two turns from standard input: the second turn prefills only its new tokens after the
//    ones the session already holds (the KDA states and MLA caches carried on), and the
//    session holds exactly the first turn's prompt, reply and (if cut) closing tokens;
//  - bad options and a model directory without tiktoken.model: one line, exit 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "common/cli_run.h"
#include "common/fixture.h"

namespace fs = std::filesystem;
using k3::test::RunResult;

namespace {

using k3::test::kReleaseTiny;

using k3::test::q;

struct Turn {
  long long new_tokens = -1, cached = -1, generated = -1;
  std::string how;
};

std::vector<Turn> turns(const std::string& err) {
  std::vector<Turn> out;
  const std::regex re(R"(\[turn \d+: (\d+) new prompt tokens after (\d+) in the session, prefill [0-9.]+ s; (\d+) tokens in [0-9.]+ s = [0-9.]+ tok/s; ([a-z ]+)\])");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), std::stoll((*it)[3]), (*it)[4]});
  return out;
}

}  // namespace

TEST(CliChat, OneTurnFromPrompt) {
  const RunResult r = k3::test::run_k3cpp("chat " + q(kReleaseTiny) + " --prompt 'Hello there' --max-tokens 6 --temperature 0");
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<Turn> t = turns(r.err);
  ASSERT_EQ(t.size(), 1u) << r.err;
  EXPECT_GT(t[0].new_tokens, 10);  // effort declaration + user message + generation prompt
  EXPECT_EQ(t[0].cached, 0);
  EXPECT_GE(t[0].generated, 1);
  EXPECT_LE(t[0].generated, 6);
  EXPECT_NE(r.err.find("kernels "), std::string::npos);  // the machine line
}

TEST(CliChat, SecondTurnReusesTheSession) {
  k3::test::TempDir d("k3_chat");
  std::ofstream(d.sub("in.txt")) << "Hello there\nAnd once more\n";
  const RunResult r = k3::test::run_k3cpp("chat " + q(kReleaseTiny) + " --max-tokens 5 --temperature 0 --no-color < " +
                                          q(d.sub("in.txt")));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<Turn> t = turns(r.err);
  ASSERT_EQ(t.size(), 2u) << r.err;
  // The session after turn 1: its prompt, every sampled token, and when the reply was cut
  // (max tokens) the closing <|close|> message <|sep|> <|end_of_msg|> ("message" is 1 to 7
  // tokens in the fixture's tiny vocabulary).
  const long long extra = t[1].cached - (t[0].new_tokens + t[0].generated);
  if (t[0].how == "end of message")
    EXPECT_EQ(extra, 0) << r.err;
  else
    EXPECT_TRUE(extra >= 4 && extra <= 10) << r.err;
  // Turn 2 encodes only the new user message and the generation prompt.
  EXPECT_GT(t[1].new_tokens, 5);
  EXPECT_LT(t[1].new_tokens, t[0].new_tokens + t[1].cached);
}

TEST(CliChat, BadInputFailsInOneLine) {
  RunResult r = k3::test::run_k3cpp("chat " + q(kReleaseTiny) + " --prompt hi --effort extreme");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--effort"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  k3::test::TempDir d("k3_chat_notok");
  for (const auto& e : fs::directory_iterator(kReleaseTiny))
    if (e.path().filename() != "tiktoken.model") fs::create_symlink(e.path(), d.sub(e.path().filename().string()));
  r = k3::test::run_k3cpp("chat " + q(d.path) + " --prompt hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("tiktoken.model"), std::string::npos) << r.err;
  r = k3::test::run_k3cpp("chat --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("usage: k3cpp chat"), std::string::npos);
}
