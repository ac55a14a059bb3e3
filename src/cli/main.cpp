// k3cpp command-line entry point: dispatches subcommands (src/cli/cmd_*.cpp register
// themselves in the table in commands.cpp). User errors print one line and exit 1.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace k3::cli;
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
