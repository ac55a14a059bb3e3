// Test helpers for running the built k3cpp binary (K3_CLI_PATH) and for temporary
// directories: shared by the CLI tests.
#pragma once
#include <string>

namespace k3::test {

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const std::string& path);                      // whole file ("" if missing)
std::string shell_quote(const std::string& s);                   // '...' for /bin/sh
RunResult run_k3cpp(const std::string& args);                     // stdout, stderr, exit code

// The short names the CLI tests use (one definition, so the test files can share a unity TU).
inline std::string q(const std::string& s) { return shell_quote(s); }
inline RunResult k3cpp(const std::string& args) { return run_k3cpp(args); }
inline bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "k3_test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string sub(const std::string& n) const { return path + "/" + n; }
};

}  // namespace k3::test
