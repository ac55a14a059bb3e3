// k3cpp command-line entry point: dispatches subcommands (src/cli/cmd_*.cpp register
// themselves in the table in commands.cpp). User errors print one line and exit 1.
// Global options, before or after the subcommand: --version (the version, the CPU and the SIMD
// target the kernels run on) and --simd-target NAME (force a lower target, like the
// K3_SIMD_TARGET environment variable; core/simd_target.h).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device_option.h"
#include "core/error.h"
#include "core/simd_target.h"
#include "kernels/blas_core.h"

#ifndef K3_VERSION
#define K3_VERSION "dev"
#endif

int main(int argc, char** argv) {
  using namespace k3::cli;
  // --simd-target NAME / --simd-target=NAME anywhere on the line applies to the whole run.
  std::vector<char*> kept;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    std::string target;
    if (a == "--simd-target") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "k3cpp: error: --simd-target needs a value (e.g. avx2, sse4, baseline)\n");
        return 2;
      }
      target = argv[++i];
    } else if (a.rfind("--simd-target=", 0) == 0) {
      target = a.substr(14);
    } else {
      kept.push_back(argv[i]);
      continue;
    }
    try {
      k3::force_simd_target(target);
    } catch (const k3::Error& e) {
      std::fprintf(stderr, "k3cpp: error: %s\n", e.what());
      return 2;
    }
  }
  argc = int(kept.size());
  argv = kept.data();
  if (argc >= 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version"))) {
    k3::blas_choose_core();
    std::printf("k3cpp %s\n%s; OpenBLAS %s\n%s\n", K3_VERSION, k3::machine_summary().c_str(),
                k3::blas_core_name().c_str(), k3::cli::describe_gpus().c_str());
    return 0;
  }
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    print_usage(stdout);
    return argc < 2 ? 2 : 0;
  }
  const Command* cmd = find_command(argv[1]);
  if (!cmd) {
    std::fprintf(stderr, "k3cpp: unknown command '%s' (see 'k3cpp --help')\n", argv[1]);
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return cmd->run(args);
  } catch (const k3::Error& e) {
    std::fprintf(stderr, "k3cpp %s: error: %s\n", argv[1], e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3cpp %s: error: %s\n", argv[1], e.what());
    return 1;
  }
}
