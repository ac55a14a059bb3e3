// `k3cpp init <config.json> <out dir> --seed N [--experts plain|mxfp4] [--dtype f32|bf16]
//              [--force] [--threads N]`
// Writes a randomly initialised checkpoint (model/init.h recipes, deterministic given the
// seed) in the released layout (model/checkpoint.h): safetensors under the released names,
// config.json and, when the vocabulary holds the 256 bytes, the k3cpp byte tokenizer.json
// (special tokens that fit the vocabulary). Refuses a non-empty output directory unless
// --force, which replaces it atomically.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "io/config.h"
#include "io/tokenizer.h"
#include "model/checkpoint.h"
#include "model/init.h"

namespace k3::cli {
namespace {

const char* kInitUsage =
    "usage: k3cpp init <config.json> <out dir> --seed N [--experts plain|mxfp4] [--dtype f32|bf16]\n"
    "                  [--force] [--threads N]\n"
    "  --seed     random seed (default 0); the same seed gives the same checkpoint everywhere\n"
    "  --experts  routed expert storage: plain (default) or mxfp4 (widths must be multiples of 32)\n"
    "  --dtype    dense tensor dtype: f32 (default, exact) or bf16 (the release's)\n"
    "  --force    replace a non-empty output directory\n";

// The byte tokenizer's JSON with only the special tokens whose ids fit the vocabulary; "" if
// the vocabulary cannot hold the 256 byte ids.
std::string byte_tokenizer_json(int64_t vocab) {
  if (vocab < 256) return "";
  nlohmann::json j = nlohmann::json::parse(ByteTokenizer().to_json());
  nlohmann::json keep = nlohmann::json::object();
  for (auto& [name, id] : j["special_tokens"].items())
    if (id.get<int64_t>() < vocab) keep[name] = id;
  j["special_tokens"] = keep;
  return j.dump(2) + "\n";
}

std::string size_text(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

}  // namespace

int cmd_init(const std::vector<std::string>& args) {
  Args a(args, {"seed", "experts", "dtype", "threads"}, {"force", "help"}, "init");
  if (a.flag("help")) {
    std::fputs(kInitUsage, stdout);
    return 0;
  }
  if (a.positional().size() != 2)
    fail("expected <config.json> <out dir>, got " + std::to_string(a.positional().size()) + " argument(s)");
  const std::string config_path = a.positional_at(0, "config.json"), out = a.positional_at(1, "out dir");
  const long long seed = a.get_int("seed", 0);
  if (seed < 0) fail("--seed: expected a non-negative integer, got " + std::to_string(seed));
  const std::string experts = a.get_or("experts", "plain"), dtype = a.get_or("dtype", "f32");
  if (experts != "plain" && experts != "mxfp4") fail("--experts: expected plain or mxfp4, got '" + experts + "'");
  if (dtype != "f32" && dtype != "bf16") fail("--dtype: expected f32 or bf16, got '" + dtype + "'");
  set_num_threads(int(a.get_int("threads", 0)));

  const K3Config cfg = load_config(config_path);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) fail_input(out, "", "exists and is not a directory");
    if (!fs::is_empty(out, ec) && !a.flag("force"))
      fail_input(out, "", "directory exists and is not empty (pass --force to replace it)");
  }

  InitOptions io;
  io.seed = uint64_t(seed);
  io.experts = experts == "mxfp4" ? ExpertStorage::Mxfp4 : ExpertStorage::Plain;
  int64_t total = 0;
  for (const ParamSpec& s : k3_param_specs(cfg)) total += s.numel();
  const bool show = total >= 100'000'000;  // progress lines only where init takes a while
  int last_pct = -1;
  WeightStore w = init_weights(cfg, io, [&](int64_t done, int64_t all) {
    const int pct = int(100 * done / std::max<int64_t>(all, 1));
    if (show && pct / 10 != last_pct / 10) {
      std::fprintf(stderr, "init: %3d%% of %lld parameters\n", pct, (long long)all);
      last_pct = pct;
    }
  });

  SaveOptions so;
  so.dense_dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
  so.experts = io.experts;
  so.tokenizer_json = byte_tokenizer_json(cfg.vocab_size);
  if (show) std::fprintf(stderr, "init: writing %s\n", out.c_str());
  const std::vector<std::string> files = save_checkpoint(out, w, so);
  uint64_t bytes = 0;
  for (const std::string& f : files) bytes += uint64_t(fs::file_size(f, ec));
  std::printf("wrote %s: %lld parameters, %s in %zu safetensors file(s), dense %s, experts %s, seed %lld%s\n",
              out.c_str(), (long long)total, size_text(double(bytes)).c_str(), files.size(), dtype.c_str(),
              experts.c_str(), seed, so.tokenizer_json.empty() ? " (no tokenizer: vocabulary < 256)" : "");
  return 0;
}

}  // namespace k3::cli
