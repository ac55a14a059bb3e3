// Tokenizer encode speed: single-thread MB/s of Tiktoken::encode per pattern (cl100k and
// o200k with their ranks and patterns, the Kimi pattern over o200k ranks), and
// encode_batch over the corpus split into documents at 1..N threads (scaling). Reads the
// corpus and vocabularies that tools/oracle/oracle.mjs writes; scripts/tokenizer_bench.sh
// runs both that and npm tiktoken's figure (tools/oracle/bench.mjs) in one go.
// Usage: bench_tokenizer --oracle-dir=DIR [--max-threads=N] [benchmark flags]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_results.h"
#include "io/tiktoken.h"
#include "io/tiktoken_file.h"

namespace {

struct Doc {
  std::string name, bytes;
};

std::vector<Doc> read_corpus(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "bench_tokenizer: cannot open %s (run node tools/oracle/oracle.mjs DIR first)\n", path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string b = ss.str();
  size_t o = 0;
  auto u32 = [&] {
    uint32_t v;
    std::memcpy(&v, b.data() + o, 4);
    o += 4;
    return v;
  };
  std::vector<Doc> docs(u32());
  for (auto& d : docs) {
    uint32_t n = u32();
    d.name = b.substr(o, n);
    o += n;
    n = u32();
    d.bytes = b.substr(o, n);
    o += n;
  }
  return docs;
}

// As in tools/oracle/bench.mjs: leave out the 25,000+-character single pieces, which the
// reference merges in quadratic time, so both figures are about ordinary text.
bool ordinary(const Doc& d) {
  for (const char* p : {"gen:spaces", "gen:newlines", "gen:mixedspace", "gen:letters"})
    if (d.name.rfind(p, 0) == 0) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int max_threads = int(std::thread::hardware_concurrency());
  k3::bench::take_own_flags(argc, argv, [&](const std::string&, auto val) {
    if (const char* v = val("--oracle-dir=")) { dir = v; return true; }
    if (const char* v = val("--max-threads=")) { max_threads = std::atoi(v); return true; }
    return false;
  });
  if (dir.empty()) {
    std::fprintf(stderr, "usage: bench_tokenizer --oracle-dir=DIR [--max-threads=N] (DIR from tools/oracle/oracle.mjs)\n");
    return 2;
  }
  static std::vector<Doc> docs;
  for (auto& d : read_corpus(dir + "/corpus.bin"))
    if (ordinary(d)) docs.push_back(std::move(d));
  static std::vector<std::string_view> views;
  size_t bytes = 0;
  for (const auto& d : docs) {
    views.emplace_back(d.bytes);
    bytes += d.bytes.size();
  }
  static std::vector<std::unique_ptr<k3::Tiktoken>> toks;
  struct Mode {
    const char* name;
    const char* ranks;
    k3::PatternKind pattern;
  };
  for (Mode m : {Mode{"cl100k", "cl100k_base", k3::PatternKind::cl100k}, Mode{"o200k", "o200k_base", k3::PatternKind::o200k},
                 Mode{"kimi_o200k", "o200k_base", k3::PatternKind::kimi}}) {
    toks.push_back(std::make_unique<k3::Tiktoken>(k3::read_tiktoken_model(dir + "/" + m.ranks + ".tiktoken"),
                                                  std::vector<k3::SpecialToken>{}, m.pattern));
    const k3::Tiktoken* tok = toks.back().get();
    benchmark::RegisterBenchmark((std::string("encode_1thread/") + m.name).c_str(), [tok, bytes](benchmark::State& st) {
      size_t n = 0;
      for (auto _ : st)
        for (auto v : views) n += tok->encode(v).size();
      st.SetBytesProcessed(int64_t(bytes) * st.iterations());
      st.counters["tokens"] = double(n) / double(st.iterations());
    })->Unit(benchmark::kMillisecond)->Iterations(3);
    if (m.pattern != k3::PatternKind::kimi) continue;
    std::vector<int> counts;  // 1, 2, 4, ... and max_threads itself
    for (int t = 1; t < max_threads; t *= 2) counts.push_back(t);
    counts.push_back(std::max(1, max_threads));
    for (int t : counts) {
      benchmark::RegisterBenchmark((std::string("encode_batch/") + m.name + "/threads:" + std::to_string(t)).c_str(),
                                   [tok, bytes, t](benchmark::State& st) {
                                     for (auto _ : st) benchmark::DoNotOptimize(tok->encode_batch(views, t));
                                     st.SetBytesProcessed(int64_t(bytes) * st.iterations());
                                   })
          ->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
    }
  }
  std::printf("bench_tokenizer: %zu documents, %.2f MB\n", docs.size(), double(bytes) / 1e6);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
