#include "common/cli_run.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace k3::test {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (fs::temp_directory_path() / (prefix + "_XXXXXX")).string();
  const char* p = ::mkdtemp(tmpl.data());
  if (!p) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

RunResult run_k3cpp(const std::string& args) {
  TempDir t("k3_cli_run");
  const std::string err_file = t.sub("stderr");
  const std::string cmd = shell_quote(K3_CLI_PATH) + " " + args + " 2>" + shell_quote(err_file);
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(err_file);
  return r;
}

}  // namespace k3::test
