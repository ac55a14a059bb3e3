// k3_make_slice <config.json> <out dir> [--seed N]
// Writes a random checkpoint of `config.json` in the released layout for the memory-limited
// inference benchmark (scripts/bench_memory_limited.sh): names and shapes from the parameter
// table (model/param_specs.h), dense tensors bf16 drawn by the init recipes (model/init.h),
// routed experts MXFP4 (weight_packed: random nibbles; weight_scale: E8M0 2^-7, so weights
// have an RMS of about 0.023), one safetensors shard per decoder layer plus one for the
// global tensors, and model.safetensors.index.json. Data is streamed to disk (no tensor
// larger than one dense matrix is held): a 15.7 GB MoE layer of K3 needs ~1 GB of memory.
// The expert bytes come from a 64 MiB random pool at pseudo-random offsets: their values do
// not matter to the I/O measured, only that the kernels see finite, varied weights.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/config.h"
#include "model/init.h"
#include "model/param_specs.h"

using namespace k3;
using json = nlohmann::ordered_json;

namespace {

struct Item {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes;
  const ParamSpec* spec;  // dense: the spec; experts: the matrix spec
  int part;               // -1 dense, 0 packed, 1 scales
};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  while (n) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0) fail_system("write", path);
    b += w;
    n -= size_t(w);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 3) {
      std::fprintf(stderr, "usage: k3_make_slice <config.json> <out dir> [--seed N]\n");
      return 2;
    }
    const std::string cfg_path = argv[1], out = argv[2];
    uint64_t seed = 1;
    if (argc >= 5 && std::string(argv[3]) == "--seed") seed = std::stoull(argv[4]);
    const K3Config cfg = load_config(cfg_path);
    const std::vector<ParamSpec> specs = k3_param_specs(cfg);
    std::filesystem::create_directories(out);
    // Shard per layer (+1 for the globals, last).
    const int64_t L = cfg.num_hidden_layers, n_shards = L + 1;
    std::vector<std::vector<Item>> shards(static_cast<size_t>(n_shards));
    for (const ParamSpec& s : specs) {
      const size_t sh = s.layer >= 0 ? size_t(s.layer) : size_t(L);
      if (s.component == Component::RoutedExperts) {
        const std::string base = s.name.substr(0, s.name.size() - std::string("weight").size());
        const int64_t r = s.shape[0], c = s.shape[1];
        shards[sh].push_back({base + "weight_packed", DType::U8, {r, c / 2}, uint64_t(r * c / 2), &s, 0});
        shards[sh].push_back({base + "weight_scale", DType::U8, {r, c / 32}, uint64_t(r * c / 32), &s, 1});
      } else {
        const bool matrix = s.shape.size() == 2 && s.shape[0] >= 2 && s.shape[1] >= 2;
        const DType dt = matrix ? DType::BF16 : DType::F32;
        shards[sh].push_back({s.name, dt, s.shape, uint64_t(s.numel()) * dtype_size(dt), &s, -1});
      }
    }
    // Larger dtypes first (f32, bf16, u8), keeping table order within: every tensor aligned,
    // each expert's six tensors adjacent.
    for (auto& v : shards)
      std::stable_sort(v.begin(), v.end(),
                       [](const Item& a, const Item& b) { return dtype_size(a.dtype) > dtype_size(b.dtype); });
    std::vector<uint8_t> pool(size_t(64) << 20);
    uint64_t st = seed * 7919 + 17;
    for (size_t i = 0; i < pool.size(); i += 8) {
      const uint64_t r = splitmix(st);
      std::memcpy(pool.data() + i, &r, 8);
    }
    json weight_map = json::object();
    uint64_t total = 0;
    for (int64_t si = 0; si < n_shards; ++si) {
      char fname[64];
      std::snprintf(fname, sizeof fname, "model-%05lld-of-%06lld.safetensors", (long long)(si + 1),
                    (long long)n_shards);
      const std::string path = out + "/" + fname;
      json hdr = json::object();
      hdr["__metadata__"] = {{"format", "pt"}};
      uint64_t off = 0;
      for (const Item& it : shards[size_t(si)]) {
        hdr[it.name] = {{"dtype", it.dtype == DType::F32 ? "F32" : it.dtype == DType::BF16 ? "BF16" : "U8"}, {"shape", it.shape}, {"data_offsets", {off, off + it.nbytes}}};
        off += it.nbytes;
        weight_map[it.name] = fname;
      }
      std::string h = hdr.dump();
      while ((h.size() + 8) % 8) h.push_back(' ');
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) fail_system("cannot create", path);
      const uint64_t hl = h.size();
      write_all(fd, &hl, 8, path);
      write_all(fd, h.data(), h.size(), path);
      std::vector<float> f;
      std::vector<uint16_t> b;
      std::vector<uint8_t> scales;
      for (const Item& it : shards[size_t(si)]) {
        if (it.part < 0) {
          f.resize(size_t(it.spec->numel()));
          init_tensor(f.data(), it.spec->numel(), *it.spec, init_rule(*it.spec), seed, 0.02, cfg.num_hidden_layers);
          if (it.dtype == DType::F32) {
            write_all(fd, f.data(), f.size() * 4, path);
          } else {
            b.resize(f.size());
            f32_to_bf16(f.data(), b.data(), f.size());
            write_all(fd, b.data(), b.size() * 2, path);
          }
        } else if (it.part == 0) {
          uint64_t left = it.nbytes;
          while (left) {
            const uint64_t start = splitmix(st) % (pool.size() / 2);
            const uint64_t n = std::min<uint64_t>(left, pool.size() / 2);
            write_all(fd, pool.data() + start, size_t(n), path);
            left -= n;
          }
        } else {
          scales.assign(size_t(it.nbytes), uint8_t(127 - 7));
          write_all(fd, scales.data(), scales.size(), path);
        }
      }
      if (::fsync(fd) != 0) fail_system("fsync", path);
      ::close(fd);
      total += off;
      std::fprintf(stderr, "wrote %s (%.2f GB)\n", path.c_str(), double(off) / 1e9);
      // Keep the page cache from filling with what was just written.
      const int rfd = ::open(path.c_str(), O_RDONLY);
      if (rfd >= 0) {
        ::posix_fadvise(rfd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(rfd);
      }
    }
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream(out + "/model.safetensors.index.json") << index.dump(2) << "\n";
    std::filesystem::copy_file(cfg_path, out + "/config.json", std::filesystem::copy_options::overwrite_existing);
    std::fprintf(stderr, "total %.2f GB in %lld shards\n", double(total) / 1e9, (long long)n_shards);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_make_slice: %s\n", e.what());
    return 1;
  }
}
