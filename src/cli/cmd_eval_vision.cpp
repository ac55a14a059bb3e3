// `k3cpp eval <model dir> --task vision --run RUN.json [--examples N] [--json out.json]`: the
// image-text evaluation a training run with images ends with (train/trainer_vision.h), on a
// saved model directory: each of the run file's tasks answered greedily with the image, with
// zeros in its place and with another example's image; Fashion-MNIST's confusion matrix.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "io/vocabulary.h"
#include "model/checkpoint.h"
#include "train/run_config.h"
#include "train/trainer_vision.h"

namespace k3::cli {

int cmd_eval_vision(const std::vector<std::string>& args) {
  Args a(args, {"task", "run", "examples", "json", "threads"}, {"help"}, "eval");
  if (a.flag("help") || !a.get("run")) {
    std::fputs("usage: k3cpp eval <model dir> --task vision --run RUN.json [--examples N] [--json out.json] [--threads N]\n"
               "  --run       the run file whose \"vision\" block names the tasks (and data paths)\n"
               "  --examples  test examples per task (default: the run file's eval_examples; 0: all)\n",
               a.flag("help") ? stdout : stderr);
    return a.flag("help") ? 0 : 2;
  }
  if (a.positional().size() != 1) fail("expected one <model dir>");
  const std::string dir = a.positional_at(0, "model dir");
  const RunConfig run = load_run_config(*a.get("run"));
  if (!run.vision.enabled) fail_input(run.path, "vision", "missing: the run file names no image tasks");
  set_num_threads(int(a.get_int("threads", 0)));
  const ModelDir md = open_model_dir(dir);
  const Vocabulary vocab = Vocabulary::load_dir(dir);
  LoadOptions lo;
  lo.dequantize_experts = true;
  const K3Model model = load_model(md, lo);
  VisionTrainPart part(run, md.config, vocab, num_threads(), 0);
  part.load(dir);
  if (a.get("examples")) part.set_eval_examples(a.get_int("examples", 0));
  const nlohmann::json ev = part.evaluate(model, a.get("json") ? *a.get("json") : std::string());
  std::printf("%s\n", ev.dump(2).c_str());
  return 0;
}

}  // namespace k3::cli
