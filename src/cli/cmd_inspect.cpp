#include "cli/commands.h"
#include "core/error.h"

namespace k3::cli {
int cmd_inspect(const std::vector<std::string>& args) {
  Args a(args, {}, {}, "inspect");
  fail("k3cpp inspect: not built yet");
}
}  // namespace k3::cli
