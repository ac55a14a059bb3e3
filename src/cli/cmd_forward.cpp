// `k3cpp forward <model dir> --ids 1,2,3 --logits out.f32 [--threads N]
//                 [--kda-path fast|chunked|recurrent] [--dequantize] [--f32-weights]`
// One full forward over the ids from a fresh state; writes float32 logits for every position,
// row-major [T, vocab], little-endian, no header, so that any tool can compare them with a
// reference (numpy.fromfile(path, "<f4").reshape(T, vocab)). The file is written atomically.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "cli/ram_budget.h"
#include "model/checkpoint.h"

namespace k3::cli {
namespace {

const char* kForwardUsage =
    "usage: k3cpp forward <model dir> --ids 1,2,3 --logits out.f32 [--threads N]\n"
    "                     [--kda-path fast|chunked|recurrent] [--dequantize] [--f32-weights]\n"
    "                     [--ram-budget GB [--cache-policy s3fifo|lru] [--io auto|direct|buffered] [--disk-gbps X]]\n"
    "  --ids         comma-separated token ids\n"
    "  --logits      output file: float32 [T, vocab], row-major, little-endian\n"
    "  --kda-path    KDA core: fast (default), chunked or recurrent (the references)\n"
    "  --dequantize  run MXFP4 routed experts from an f32 copy\n"
    "  --f32-weights widen bf16 dense weights to f32 when loading (default: kept as stored)\n";

std::string forward_usage() { return std::string(kForwardUsage) + kRamBudgetUsage; }

}  // namespace

// Helpers shared with cmd_generate.cpp (declared there, like the cmd_* entries in commands.cpp).

// "1,2,3" -> ids; k3::Error naming `what` and the bad entry.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string tok = text.substr(pos, comma - pos);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || *end || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
      fail(what + ": '" + tok + "' is not a token id (expected comma-separated integers)");
    ids.push_back(int32_t(v));
    pos = comma + 1;
  }
  if (ids.empty()) fail(what + ": no token ids given");
  return ids;
}

void check_ids_in_vocab(const std::vector<int32_t>& ids, const ModelDir& md, const std::string& what) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= md.config.vocab_size)
      fail(what + ": token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
           " is outside the vocabulary [0, " + std::to_string(md.config.vocab_size) + ") of " + md.config_path);
}

KDAPath parse_kda_path(const std::string& s) {
  if (s == "fast") return KDAPath::Fast;
  if (s == "chunked") return KDAPath::Chunked;
  if (s == "recurrent") return KDAPath::Recurrent;
  fail("--kda-path: expected fast, chunked or recurrent, got '" + s + "'");
}

int cmd_forward(const std::vector<std::string>& args) {
  Args a(args, with_ram_budget_options({"ids", "logits", "threads", "kda-path"}), {"dequantize", "f32-weights", "help"},
         "forward");
  if (a.flag("help")) {
    std::fputs(forward_usage().c_str(), stdout);
    return 0;
  }
  if (a.positional().size() != 1) fail("expected one <model dir>, got " + std::to_string(a.positional().size()));
  const std::string dir = a.positional_at(0, "model dir");
  const auto ids_arg = a.get("ids");
  if (!ids_arg) fail("--ids is required");
  const auto out = a.get("logits");
  if (!out) fail("--logits is required");
  const KDAPath path = parse_kda_path(a.get_or("kda-path", "fast"));
  set_num_threads(int(a.get_int("threads", 0)));

  // Config and ids are checked before any weight is read.
  const ModelDir md = open_model_dir(dir);
  const std::vector<int32_t> ids = parse_ids(*ids_arg, "--ids");
  check_ids_in_vocab(ids, md, "--ids");

  LoadOptions lo;
  lo.dequantize_experts = a.flag("dequantize");
  lo.dense_as_stored = !a.flag("f32-weights");
  BudgetedModel bm = load_budgeted(a, md, lo, "forward", int64_t(ids.size()));
  const K3Model& model = bm.im->model;
  announce_machine("forward");
  const int64_t T = int64_t(ids.size()), V = model.dims().V;
  std::vector<float> logits(size_t(T * V));
  DecodeState st = model.new_state();
  ForwardScratch s;
  ForwardOptions fo;
  fo.kda_path = path;
  const auto t0 = std::chrono::steady_clock::now();
  model.forward(logits.data(), ids.data(), T, st, s, fo);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_file_atomic(*out, [&](std::FILE* f) { std::fwrite(logits.data(), sizeof(float), logits.size(), f); });
  std::printf("wrote %s: float32 logits [%lld, %lld]\n", out->c_str(), (long long)T, (long long)V);
  std::fprintf(stderr, "forward: %lld tokens in %.3f s (%.1f tok/s)\n", (long long)T, sec, double(T) / std::max(sec, 1e-9));
  report_budgeted(bm, "forward");
  return 0;
}

}  // namespace k3::cli
