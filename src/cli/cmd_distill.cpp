// `k3cpp distill --config distill.json --out DIR [--resume] [--steps N] [--quiet]`
// On-policy distillation of two or more specialised policies (with / without the tool, or
// effort levels) into one student by token-level reverse KL (posttrain/distill.h).
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "posttrain/distill.h"

namespace k3::cli {

int cmd_distill(const std::vector<std::string>& args) {
  Args a(args, {"config", "out", "steps"}, {"resume", "quiet", "help"}, "distill");
  if (a.flag("help")) {
    std::fputs("usage: k3cpp distill --config distill.json --out DIR [--resume] [--steps N] [--quiet]\n"
               "  --config  model (the student), by (tool | effort), teachers {tool, no_tool} or {low, high, max},\n"
               "            arithmetic {...}, steps, prompts_per_step, samples, budgets, lr, lr_end, optimizer,\n"
               "            grad_clip, max_tool_rounds, checkpoint_every, threads, seed\n",
               stdout);
    return 0;
  }
  if (!a.positional().empty()) fail("unexpected argument '" + a.positional()[0] + "' (see k3cpp distill --help)");
  const auto config = a.get("config");
  const auto out = a.get("out");
  if (!config || !out) fail("--config and --out are required (see k3cpp distill --help)");
  const long long steps = a.get_int("steps", -1);
  if (a.get("steps") && steps < 0) fail("--steps: expected a non-negative integer");
  const DistillConfig c = load_distill_config(*config);
  announce_machine("distill");
  const DistillResult r = run_distill(c, *out, a.flag("resume"), steps, a.flag("quiet"));
  std::printf("distill: %lld steps, last reverse KL %.4f per token; model: %s\n", (long long)r.steps, r.last_kl,
              r.checkpoint_dir.c_str());
  return 0;
}

}  // namespace k3::cli
