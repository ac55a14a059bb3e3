// The benchmarks' mid-size synthetic model (configs/mid-1024.json, MXFP4 routed experts, bf16
// dense weights) as a model directory: --model_dir / $K3_BENCH_MODEL, else
// <build dir>/bench-models/mid-1024-mxfp4-bf16, created on first use like
// `k3cpp init configs/mid-1024.json DIR --seed 1 --experts mxfp4` (about a minute).
// Header-only; names live in k3::bench.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/init.h"

namespace k3::bench {

// <build dir>: the directory above bench/ that holds this binary.
inline std::filesystem::path build_dir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
}

// The source tree, from the build directory's CMakeCache.txt (k3cpp_SOURCE_DIR).
inline std::string source_dir() {
  std::ifstream f(build_dir() / "CMakeCache.txt");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("k3cpp_SOURCE_DIR:STATIC=", 0) == 0) return line.substr(24);
  return ".";
}

// The model directory, created (init + save, seed 1, MXFP4 experts, dense bf16) if it has no
// config.json yet. Empty arguments: the defaults above.
inline std::string bench_model_dir(std::string dir, const std::string& config) {
  namespace fs = std::filesystem;
  if (dir.empty())
    if (const char* e = std::getenv("K3_BENCH_MODEL")) dir = e;
  if (dir.empty()) dir = (build_dir() / "bench-models" / "mid-1024-mxfp4-bf16").string();
  if (fs::exists(fs::path(dir) / "config.json")) return dir;
  const std::string cfg_path = config.empty() ? source_dir() + "/configs/mid-1024.json" : config;
  std::printf("creating %s from %s (seed 1, MXFP4 experts, bf16 dense) ...\n", dir.c_str(), cfg_path.c_str());
  std::fflush(stdout);
  const K3Config cfg = load_config(cfg_path);
  InitOptions io;
  io.seed = 1;
  io.experts = ExpertStorage::Mxfp4;
  WeightStore w = init_weights(cfg, io);
  SaveOptions so;
  so.experts = ExpertStorage::Mxfp4;
  so.dense_dtype = DType::BF16;
  fs::create_directories(fs::path(dir).parent_path());
  save_checkpoint(dir, w, so);
  return dir;
}

// Deterministic token ids in [0, V) (an LCG; the benchmarks' prompts).
inline std::vector<int32_t> bench_tokens(int64_t n, int64_t V, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((s >> 33) % uint64_t(V));
  }
  return ids;
}

}  // namespace k3::bench
