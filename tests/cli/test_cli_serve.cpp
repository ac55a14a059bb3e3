// `k3cpp serve` through the built binary (K3_CLI_PATH): the command line only (the server
// itself is tested in tests/serve and by the Node checks):
//  - --help prints the usage, exit 0;
//  - bad options (a port out of range, --parallel 0) fail in one line, exit 1;
//  - a model directory without tiktoken.model: the server started listening (the line is on
//    stdout), then the load fails with the file named, and the process exits 1 by itself.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/cli_run.h"
#include "common/fixture.h"

namespace fs = std::filesystem;

TEST(CliServe, HelpAndBadOptions) {
  k3::test::RunResult r = k3::test::run_k3cpp("serve --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("usage: k3cpp serve"), std::string::npos);
  const std::string m = k3::test::shell_quote(k3::test::data_path("k3-release-tiny"));
  for (const char* bad : {"--port 70000", "--parallel 0", "--ctx 1", "--frobnicate 1"}) {
    r = k3::test::run_k3cpp("serve " + m + " " + bad);
    EXPECT_EQ(r.rc, 1) << bad;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
}

TEST(CliServe, LoadFailureExitsOne) {
  k3::test::TempDir d("k3_serve_notok");
  for (const auto& e : fs::directory_iterator(k3::test::data_path("k3-release-tiny")))
    if (e.path().filename() != "tiktoken.model") fs::create_symlink(e.path(), d.sub(e.path().filename().string()));
  const k3::test::RunResult r = k3::test::run_k3cpp("serve " + k3::test::shell_quote(d.path) + " --port 0");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.out.find("listening on http://127.0.0.1:"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("tiktoken.model"), std::string::npos) << r.err;
}
