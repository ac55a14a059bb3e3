// `k3cpp sft --config sft.json --out DIR [--resume] [--steps N] [--quiet]`
// Supervised fine-tuning of a pretrained k3cpp model on XTML conversations, the loss on the
// assistant tokens only (posttrain/sft.h). Metrics in DIR/metrics.jsonl, the fine-tuned model
// (a model directory with its vocabulary) in DIR/checkpoint.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "posttrain/sft.h"

namespace k3::cli {

namespace {
const char* kSftUsage =
    "usage: k3cpp sft --config sft.json --out DIR [--resume] [--steps N] [--quiet]\n"
    "  --config   model (pretrained model directory with tiktoken vocabulary), data (JSONL of chat\n"
    "             requests) or arithmetic {digits, ops, efforts, tool_share, problems, seed}, steps,\n"
    "             batch, lr, lr_end, warmup_steps, optimizer, weight_decay, grad_clip, max_tokens,\n"
    "             checkpoint_every, log_every, threads, seed; task (arithmetic | image_arithmetic:\n"
    "             the problems as rendered a+b images in the user turn, a vision model, its encoder\n"
    "             frozen; unifont FILE)\n"
    "  --out      output directory: metrics.jsonl and checkpoint/ (the fine-tuned model)\n"
    "  --resume   continue DIR/checkpoint exactly (refused if the config differs)\n"
    "  --steps    stop once N steps (counted over the whole run) are done\n"
    "  --quiet    no progress lines\n";
}  // namespace

int cmd_sft(const std::vector<std::string>& args) {
  Args a(args, {"config", "out", "steps"}, {"resume", "quiet", "help"}, "sft");
  if (a.flag("help")) {
    std::fputs(kSftUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) fail("unexpected argument '" + a.positional()[0] + "' (see k3cpp sft --help)");
  const auto config = a.get("config");
  const auto out = a.get("out");
  if (!config) fail("--config is required (see k3cpp sft --help)");
  if (!out) fail("--out is required (see k3cpp sft --help)");
  SFTOptions o;
  o.out_dir = *out;
  o.resume = a.flag("resume");
  o.quiet = a.flag("quiet");
  o.stop_at_step = a.get_int("steps", -1);
  if (a.get("steps") && o.stop_at_step < 0) fail("--steps: expected a non-negative integer");
  const SFTConfig c = load_sft_config(*config);
  announce_machine("sft");
  const SFTResult r = run_sft(c, o);
  std::printf("sft: %lld steps, last loss %.4f, %.1f s of steps; model: %s\n", (long long)r.steps, r.last_loss,
              r.seconds, r.checkpoint_dir.c_str());
  return 0;
}

}  // namespace k3::cli
