// Memory and time of opening a checkpoint's safetensors headers: the header walk
// (HeaderParse::Walk, no JSON tree) against the tree (HeaderParse::Tree). Each measurement runs
// in a fresh process so the allocator starts clean, with trimming and mmap'ed chunks turned off
// so the heap never shrinks: the heap's size after the open is its peak during it (mallinfo2).
// The child's RssAnon is also sampled every millisecond (infer/mem_probe.h).
// The default checkpoint is generated: N tensors named like a released K3's routed experts,
// in one file or K shards with an index. --checkpoint=DIR opens that instead.
// Usage: bench_checkpoint_open [--tensors=N] [--shards=K] [--checkpoint=DIR] [benchmark flags]
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "infer/mem_probe.h"
#include "io/safetensors.h"

namespace {

std::string g_checkpoint;
int64_t g_tensors = 37845;
int64_t g_shards = 1;

struct OpenCost {
  double heap_peak = 0, anon_peak = 0, seconds = 0, tensors = 0;
};

// Writes `g_tensors` one-byte tensors with release-style names (once per process): one file,
// or with --shards=K a directory of K shards and a model.safetensors.index.json.
const std::string& generated_file() {
  static std::string path;
  if (!path.empty()) return path;
  path = (std::filesystem::temp_directory_path() / ("k3-bench-open-" + std::to_string(::getpid()))).string();
  std::vector<std::pair<std::string, k3::Tensor>> tensors;
  const k3::Tensor one = k3::Tensor::zeros(k3::DType::U8, {1});
  for (int64_t i = 0; i < g_tensors; ++i)
    tensors.emplace_back("language_model.model.layers." + std::to_string(i / 4096) + ".mlp.experts." +
                             std::to_string(i % 4096) + (i % 2 ? ".down_proj.weight_packed" : ".gate_up_proj.weight_scale"),
                         one);
  const uint64_t per_shard = uint64_t((g_tensors + g_shards - 1) / g_shards);
  k3::write_checkpoint_shards(path, tensors, g_shards > 1 ? per_shard : uint64_t(g_tensors) + 1);
  std::atexit([] { std::filesystem::remove_all(path); });
  return path;
}

// In the re-executed child: open `path`, write the cost to fd 1's pipe (argv), exit.
int child_main(const std::string& path, k3::HeaderParse parse, int out_fd) {
  mallopt(M_TRIM_THRESHOLD, -1);  // never give the heap back, never mmap a chunk: the heap's
  mallopt(M_MMAP_MAX, 0);         // size after the open is its peak during it
  OpenCost c;
  const size_t heap0 = mallinfo2().arena;
  {
    k3::MemSampler sampler(1);
    const int64_t anon0 = k3::read_proc_mem().rss_anon;
    const auto t0 = std::chrono::steady_clock::now();
    k3::CheckpointReader r = k3::CheckpointReader::open(path, parse);
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c.tensors = double(r.size());
    sampler.stop();
    c.anon_peak = double(sampler.peak_anon() - anon0);
  }
  c.heap_peak = double(mallinfo2().arena - heap0);
  return ::write(out_fd, &c, sizeof c) == ssize_t(sizeof c) ? 0 : 3;
}

// A fresh process per measurement (fork + exec of this binary), so no earlier allocation
// (the generated file's writer) leaves free heap behind for the open to reuse.
OpenCost measure_in_child(k3::HeaderParse parse) {
  const std::string path = g_checkpoint.empty() ? generated_file() : g_checkpoint;
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string fd = std::to_string(fds[1]);
    const char* mode = parse == k3::HeaderParse::Walk ? "walk" : "tree";
    ::execl("/proc/self/exe", "bench_checkpoint_open", "--child", path.c_str(), mode, fd.c_str(), (char*)nullptr);
    ::_exit(4);
  }
  ::close(fds[1]);
  OpenCost c;
  const bool got = ::read(fds[0], &c, sizeof c) == ssize_t(sizeof c);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench_checkpoint_open: the child opening %s failed\n", path.c_str());
    std::exit(2);
  }
  return c;
}

void BM_open(benchmark::State& state, k3::HeaderParse parse) {
  OpenCost last;
  double secs = 0;
  for (auto _ : state) {
    last = measure_in_child(parse);
    secs += last.seconds;
    state.SetIterationTime(last.seconds);
  }
  state.counters["tensors"] = last.tensors;
  state.counters["heap_peak_MB"] = last.heap_peak / 1e6;
  state.counters["rss_anon_peak_MB"] = last.anon_peak / 1e6;
  state.counters["heap_B_per_tensor"] = last.heap_peak / std::max(1.0, last.tensors);
  state.counters["open_ms"] = 1e3 * secs / double(state.iterations());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--child") == 0)
    return child_main(argv[2], std::strcmp(argv[3], "walk") == 0 ? k3::HeaderParse::Walk : k3::HeaderParse::Tree,
                      std::atoi(argv[4]));
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--checkpoint=", 13) == 0) g_checkpoint = argv[i] + 13;
    else if (std::strncmp(argv[i], "--tensors=", 10) == 0) g_tensors = std::atoll(argv[i] + 10);
    else if (std::strncmp(argv[i], "--shards=", 9) == 0) g_shards = std::max<int64_t>(1, std::atoll(argv[i] + 9));
    else continue;
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc, --i;
  }
  benchmark::RegisterBenchmark("checkpoint_open/walk", BM_open, k3::HeaderParse::Walk)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("checkpoint_open/tree", BM_open, k3::HeaderParse::Tree)->UseManualTime()->Iterations(3);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
