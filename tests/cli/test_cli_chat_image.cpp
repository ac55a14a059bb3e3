// `k3cpp chat` with images (--image FILE for the first turn, a `/image FILE` line for the
// next) on the released-layout fixture (tests/data/k3-release-tiny, whose random encoder has
// patch 4 and a 2 x 2 merge: a 24 x 24 image is 9 tokens). The image's one <|media_pad|>
// becomes its 9 tokens, so a turn with the image prefills exactly 9 more tokens than the same
// turn without; a `/image` with a missing file is reported and the chat goes on; --image with a
// missing file, or on a model without vision_config, fails in one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "common/cli_run.h"
#include "common/fixture.h"
#include "io/image.h"

namespace fs = std::filesystem;
using k3::test::RunResult;

namespace {

using k3::test::kReleaseTiny;

using k3::test::q;

std::vector<long long> new_tokens(const std::string& err) {
  std::vector<long long> out;
  const std::regex re(R"(\[turn \d+: (\d+) new prompt tokens after)");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stoll((*it)[1]));
  return out;
}

void write_image(const std::string& path) {
  k3::Image img;
  img.height = img.width = 24;
  for (int i = 0; i < 3 * 24 * 24; ++i) img.rgb.push_back(float((i * 37) % 256) / 255.0f);
  k3::save_image(path, img);
}

}  // namespace

TEST(CliChatImage, FlagAndCommandAttachTheImage) {
  k3::test::TempDir d("k3_chat_image");
  write_image(d.sub("a.png"));
  const std::string base = "chat " + q(kReleaseTiny) + " --max-tokens 4 --temperature 0 --no-color";
  const RunResult plain = k3::test::run_k3cpp(base + " --prompt 'Hello there'");
  const RunResult with = k3::test::run_k3cpp(base + " --prompt 'Hello there' --image " + q(d.sub("a.png")));
  ASSERT_EQ(plain.rc, 0) << plain.err;
  ASSERT_EQ(with.rc, 0) << with.err;
  EXPECT_NE(with.err.find("24x24 pixels, 9 tokens"), std::string::npos) << with.err;
  ASSERT_EQ(new_tokens(plain.err).size(), 1u) << plain.err;
  ASSERT_EQ(new_tokens(with.err).size(), 1u) << with.err;
  EXPECT_EQ(new_tokens(with.err)[0], new_tokens(plain.err)[0] + 9);

  // Standard input: the image goes with the second turn; a bad /image is reported, nothing attached.
  std::ofstream(d.sub("plain.txt")) << "Hello there\nAnd once more\n";
  std::ofstream(d.sub("img.txt")) << "Hello there\n/image " << d.sub("missing.png") << "\n/image " << d.sub("a.png")
                                  << "\nAnd once more\n";
  const RunResult p2 = k3::test::run_k3cpp(base + " < " + q(d.sub("plain.txt")));
  const RunResult i2 = k3::test::run_k3cpp(base + " < " + q(d.sub("img.txt")));
  ASSERT_EQ(p2.rc, 0) << p2.err;
  ASSERT_EQ(i2.rc, 0) << i2.err;
  EXPECT_NE(i2.err.find("missing.png"), std::string::npos) << i2.err;
  const auto pt = new_tokens(p2.err), it = new_tokens(i2.err);
  ASSERT_EQ(pt.size(), 2u) << p2.err;
  ASSERT_EQ(it.size(), 2u) << i2.err;
  EXPECT_EQ(it[0], pt[0]);
  EXPECT_EQ(it[1], pt[1] + 9);
}

TEST(CliChatImage, BadImageOrNoVisionFailsInOneLine) {
  k3::test::TempDir d("k3_chat_image");
  write_image(d.sub("a.png"));
  const RunResult missing =
      k3::test::run_k3cpp("chat " + q(kReleaseTiny) + " --prompt hi --image " + q(d.sub("nope.png")));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find("nope.png"), std::string::npos) << missing.err;
  // The fixture without its vision_config (weights linked).
  const std::string nv = d.sub("novision");
  fs::create_directory(nv);
  for (const auto& e : fs::directory_iterator(kReleaseTiny))
    if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), nv + "/" + e.path().filename().string());
  std::ifstream in(kReleaseTiny + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg.erase("vision_config");
  std::ofstream(nv + "/config.json") << cfg.dump(2);
  const RunResult r = k3::test::run_k3cpp("chat " + q(nv) + " --prompt hi --image " + q(d.sub("a.png")));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("vision_config"), std::string::npos) << r.err;
}
