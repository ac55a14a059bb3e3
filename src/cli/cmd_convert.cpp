// `k3cpp convert <model dir> <out dir> [--experts plain|mxfp4] [--dtype f32|bf16] [--force]`
// Rewrites a model directory (a training checkpoint, an init, a release-layout directory) with
// another storage: routed experts quantised to MXFP4 (what memory-limited inference streams and
// the release stores) or widened to f32, dense tensors in bf16 or f32. The vocabulary files
// (tiktoken.model, tokenizer_config.json, tokenizer.json) are copied into the new directory
// before it is swapped into place (model/checkpoint.h: atomic); the training state is not
// (the result is a model for inference, not a resumable run).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/checkpoint.h"

namespace k3::cli {
namespace {

const char* kConvertUsage =
    "usage: k3cpp convert <model dir> <out dir> [--experts plain|mxfp4] [--dtype f32|bf16] [--force]\n"
    "                     [--threads N]\n"
    "  --experts  routed expert storage of the copy: mxfp4 (default; widths must be multiples of 32)\n"
    "             or plain (f32)\n"
    "  --dtype    dense tensors: bf16 (default, the release's) or f32\n"
    "  --force    replace a non-empty output directory\n";

}  // namespace

int cmd_convert(const std::vector<std::string>& args) {
  Args a(args, {"experts", "dtype", "threads"}, {"force", "help"}, "convert");
  if (a.flag("help")) {
    std::fputs(kConvertUsage, stdout);
    return 0;
  }
  if (a.positional().size() != 2)
    fail("expected <model dir> <out dir>, got " + std::to_string(a.positional().size()) + " argument(s)");
  const std::string in = a.positional_at(0, "model dir"), out = a.positional_at(1, "out dir");
  const std::string experts = a.get_or("experts", "mxfp4"), dtype = a.get_or("dtype", "bf16");
  if (experts != "plain" && experts != "mxfp4") fail("--experts: expected plain or mxfp4, got '" + experts + "'");
  if (dtype != "f32" && dtype != "bf16") fail("--dtype: expected f32 or bf16, got '" + dtype + "'");
  set_num_threads(int(a.get_int("threads", 0)));

  namespace fs = std::filesystem;
  std::error_code ec;
  const ModelDir md = open_model_dir(in);
  if (fs::exists(out, ec)) {
    if (fs::equivalent(in, out, ec)) fail_input(out, "", "is the model directory itself: convert into another one");
    if (!fs::is_directory(out, ec)) fail_input(out, "", "exists and is not a directory");
    if (!fs::is_empty(out, ec) && !a.flag("force"))
      fail_input(out, "", "directory exists and is not empty (pass --force to replace it)");
  }
  SaveOptions so;
  so.experts = experts == "mxfp4" ? ExpertStorage::Mxfp4 : ExpertStorage::Plain;
  so.dense_dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
  if (so.experts == ExpertStorage::Mxfp4)
    for (int64_t w : {md.config.routed_expert_hidden_size, md.config.moe_intermediate_size})
      if (w % 32 != 0)
        fail_input(md.config_path, "moe_intermediate_size",
                   "MXFP4 experts need widths that are multiples of 32 (the expert's widths are " +
                       std::to_string(md.config.routed_expert_hidden_size) + " and " +
                       std::to_string(md.config.moe_intermediate_size) + "): use --experts plain");
  so.before_commit = [&](const std::string& tmp) { copy_vocabulary_files(in, tmp); };
  so.tokenizer_json.clear();  // copied as it was, not regenerated
  const K3Model m = load_model(md);  // f32 dense, experts as stored (re-encoded or widened by the save)
  const std::vector<std::string> files = save_checkpoint(out, m.weights(), so);
  uint64_t bytes = 0;
  for (const std::string& f : files) bytes += uint64_t(fs::file_size(f, ec));
  std::printf("wrote %s: %zu safetensors file(s), %.1f MB, dense %s, experts %s, vocabulary files copied\n",
              out.c_str(), files.size(), double(bytes) / 1e6, dtype.c_str(), experts.c_str());
  return 0;
}

}  // namespace k3::cli
