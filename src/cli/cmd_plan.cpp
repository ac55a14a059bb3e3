#include "cli/commands.h"
#include "core/error.h"

namespace k3::cli {
int cmd_plan(const std::vector<std::string>& args) {
  Args a(args, {}, {}, "plan");
  fail("k3cpp plan: not built yet");
}
}  // namespace k3::cli
