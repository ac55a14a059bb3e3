// `k3cpp rl --config rl.json --out DIR [--resume] [--steps N] [--quiet]`
// `k3cpp rl --config rl.json --eval MODEL_DIR [--tool-share X] [--samples K]`
// RL with verifiable rewards on arithmetic (posttrain/rl.h): group sampling through batched
// decoding, exact-answer rewards, DAPO (default) or mirror-descent loss, effort budgets,
// partial rollouts, the calculator tool. --eval prints the evaluation of a model on the
// config's `eval` problems as JSON (pass@1, pass@k, lengths, over-budget share, tool use).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "infer/chat_vocab.h"
#include "model/checkpoint.h"
#include "posttrain/arith_eval.h"
#include "posttrain/rl.h"

namespace k3::cli {

namespace {
const char* kRlUsage =
    "usage: k3cpp rl --config rl.json --out DIR [--resume] [--steps N] [--quiet]\n"
    "       k3cpp rl --config rl.json --eval MODEL_DIR [--tool-share X] [--samples K]\n"
    "  --config      model (the SFT model directory), task (arithmetic | image_arithmetic: rendered\n"
    "                a+b images in the user turn, a vision model's frozen encoder; unifont FILE),\n"
    "                arithmetic {digits, ops | bands [\"2+\", \"3*\"],\n"
    "                efforts, tool_share, problems | problems_per_band, seed} (the prompts: a curriculum\n"
    "                by bands), eval {the same fields}, eval_every, eval_samples, steps, prompts_per_step,\n"
    "                group_size, budgets {low, high, max}, tool_budgets {low, high, max} (prompts with\n"
    "                the calculator; default: budgets), lambda, loss (dapo | mirror), clip_low,\n"
    "                clip_high, is_cap, kl_coef, tau, std_norm, format_penalty, lr, lr_end,\n"
    "                warmup_steps, optimizer, weight_decay, grad_clip, max_tool_rounds,\n"
    "                checkpoint_every, log_every, threads, seed\n"
    "  --out         output directory: metrics.jsonl and checkpoint/ (the trained policy)\n"
    "  --resume      continue DIR/checkpoint (refused if the config differs)\n"
    "  --steps       stop once N steps (counted over the whole run) are done\n"
    "  --eval        evaluate MODEL_DIR on the config's eval problems; JSON on stdout\n"
    "  --tool-share  with --eval: override eval.tool_share (0: no tool, 1: every problem)\n"
    "  --samples     with --eval: samples per problem (default: eval_samples)\n";
}  // namespace

int cmd_rl(const std::vector<std::string>& args) {
  Args a(args, {"config", "out", "steps", "eval", "tool-share", "samples"}, {"resume", "quiet", "help"}, "rl");
  if (a.flag("help")) {
    std::fputs(kRlUsage, stdout);
    return 0;
  }
  if (!a.positional().empty()) fail("unexpected argument '" + a.positional()[0] + "' (see k3cpp rl --help)");
  const auto config = a.get("config");
  if (!config) fail("--config is required (see k3cpp rl --help)");
  const RLConfig c = load_rl_config(*config);
  if (const auto dir = a.get("eval")) {
    if (!c.eval) fail_input(*config, "eval", "missing (the problems --eval evaluates)");
    ArithFamily f = *c.eval;
    if (a.get("tool-share")) {
      f.tool_share = a.get_double("tool-share", 0.0);
      if (f.tool_share < 0 || f.tool_share > 1) fail("--tool-share: expected a number in [0, 1]");
    }
    ArithEvalOptions eo;
    eo.samples = a.get_int("samples", c.eval_samples);
    if (eo.samples < 1) fail("--samples: expected a positive integer");
    eo.budget = [&](chat::Effort e, bool tool) { return c.budget(e, tool); };
    eo.max_tool_rounds = c.max_tool_rounds;
    announce_machine("rl");
    LoadOptions lo;
    lo.dequantize_experts = true;
    const ModelDir md = open_model_dir(*dir);
    const K3Model model = load_model(md, lo);
    const ChatVocab vocab = load_chat_vocab(md);
    std::optional<ImageTask> img;
    if (c.task == PosttrainTask::image_arithmetic) {
      if (f.tool_share != 0) fail("--tool-share: the image_arithmetic task has no tool prompts");
      img.emplace(load_image_task(md, c.unifont, *config));
      eo.image = &*img;
    }
    std::printf("%s\n", evaluate_arith(model, vocab, f, eo).dump().c_str());
    return 0;
  }
  const auto out = a.get("out");
  if (!out) fail("--out is required (see k3cpp rl --help)");
  RLOptions o;
  o.out_dir = *out;
  o.resume = a.flag("resume");
  o.quiet = a.flag("quiet");
  o.stop_at_step = a.get_int("steps", -1);
  if (a.get("steps") && o.stop_at_step < 0) fail("--steps: expected a non-negative integer");
  announce_machine("rl");
  const RLResult r = run_rl(c, o);
  std::printf("rl: %lld steps, last reward %.3f; model: %s\n", (long long)r.steps, r.last_reward, r.checkpoint_dir.c_str());
  return 0;
}

}  // namespace k3::cli
