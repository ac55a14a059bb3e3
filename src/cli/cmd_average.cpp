// `k3cpp average <model dir> <model dir>... --out <dir> [--weights a,b,...] [--force]`
// Writes the weighted mean of several checkpoints of one model (model/weight_average.h): e.g.
// the snapshots a run keeps over its last steps. The vocabulary files (tiktoken.model,
// tokenizer_config.json, tokenizer.json) must be the same in every input and are copied; the
// result is f32 with plain experts (`k3cpp convert` makes an MXFP4 / bf16 copy) and is written
// whole into a temporary directory, then swapped into place (model/checkpoint.h). No training
// state is written: the result is a model, not a resumable run.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "model/checkpoint.h"
#include "model/weight_average.h"

namespace k3::cli {
namespace {

const char* kAverageUsage =
    "usage: k3cpp average <model dir> <model dir>... --out <dir> [--weights a,b,...] [--force]\n"
    "  the weighted mean of checkpoints of one model (the same config.json), written as a model\n"
    "  directory (f32, plain experts) with the inputs' vocabulary files\n"
    "  --weights  one non-negative weight per model, normalised to sum 1 (default: equal)\n"
    "  --force    replace a non-empty output directory\n";

}  // namespace

int cmd_average(const std::vector<std::string>& args) {
  Args a(args, {"out", "weights"}, {"force", "help"}, "average");
  if (a.flag("help")) {
    std::fputs(kAverageUsage, stdout);
    return 0;
  }
  const std::vector<std::string>& dirs = a.positional();
  if (dirs.size() < 2)
    fail("expected at least two model directories, got " + std::to_string(dirs.size()) + " (see --help)");
  const std::optional<std::string> out_opt = a.get("out");
  if (!out_opt) fail("--out <dir> is required: where the averaged model goes");
  const std::string out = *out_opt;
  std::vector<double> weights(dirs.size(), 1.0);
  if (const auto w = a.get("weights")) weights = parse_number_list("--weights", *w);

  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& d : dirs)
    if (fs::exists(out, ec) && fs::exists(d, ec) && fs::equivalent(d, out, ec))
      fail_input(out, "", "is one of the models being averaged: write the average elsewhere");
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) fail_input(out, "", "exists and is not a directory");
    if (!fs::is_empty(out, ec) && !a.flag("force"))
      fail_input(out, "", "directory exists and is not empty (pass --force to replace it)");
  }
  // The vocabulary must be one: present in every input or in none, byte for byte the same.
  for (const std::string& f : vocabulary_file_names()) {
    const fs::path first = fs::path(dirs[0]) / f;
    const bool in_first = fs::exists(first, ec);
    const std::string first_bytes = in_first ? read_file_bytes(first.string(), "vocabulary file") : std::string();
    for (size_t i = 1; i < dirs.size(); ++i) {
      const fs::path p = fs::path(dirs[i]) / f;
      const bool here = fs::exists(p, ec);
      if (here != in_first)
        fail_input(here ? p.string() : first.string(), "",
                   here ? "present here but not in the first model: the models' vocabularies differ"
                        : "present here but missing from " + dirs[i] + ": the models' vocabularies differ");
      if (here && read_file_bytes(p.string(), "vocabulary file") != first_bytes)
        fail_input(p.string(), "", "differs from " + first.string() + ": the models' vocabularies differ");
    }
  }

  const AveragedModel avg = average_model_dirs(dirs, weights);
  SaveOptions so;  // f32 dense, plain experts: the average is not re-quantised
  so.before_commit = [&](const std::string& tmp) { copy_vocabulary_files(dirs[0], tmp); };
  const std::vector<std::string> files = save_checkpoint(out, avg.weights, so);
  uint64_t bytes = 0;
  for (const std::string& f : files) bytes += uint64_t(fs::file_size(f, ec));
  std::string coeffs;
  for (double c : avg.coefficients) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4g", coeffs.empty() ? "" : ", ", c);
    coeffs += buf;
  }
  std::printf("wrote %s: the average of %zu models (weights %s), %.1f MB, f32, plain experts\n", out.c_str(),
              dirs.size(), coeffs.c_str(), double(bytes) / 1e6);
  return 0;
}

}  // namespace k3::cli
