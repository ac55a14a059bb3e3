// Whole-model inference benchmark (docs/benchmarks.md, section "Inference (mid-1024, MXFP4
// experts, 2 threads)"): the mid-size synthetic model of configs/mid-1024.json with MXFP4
// routed experts and bf16 dense weights, loaded like `k3cpp generate` loads it (dense bf16
// matrices and MXFP4 experts kept as stored: zero-copy views of the mmap'ed checkpoint), driven
// through infer/session.h. In run order:
//   machine/*           the machine's figures in the same run (bench/machine_peak.h): OpenBLAS
//                       sgemm 2048^3 (the f32 matrix-multiply peak) and the streaming-read
//                       memory bandwidth; their buffers are freed before the model runs;
//   infer/decode        one Session::step per iteration after a --prompt token prefill;
//   infer/prefill/T     Session::prefill of T tokens (default 2048) from an empty state.
// Counters of the model runs (and the summary printed at the end) are the targets of project
// issue 3:
//   decode:  tok/s against bound_tok/s = bandwidth (the fastest streaming-read pass of the run:
//            this VM's bandwidth moves with the host) / bytes one decode token touches: every
//            dense weight in its in-memory dtype (bf16 matrices as stored, f32 vectors; the
//            embedding one row),
//            the top-k experts' MXFP4 bytes per MoE layer, and the decode caches read (KDA
//            recurrent + conv state, the MLA latent cache at the benchmark's context);
//            of_bound = tok/s / bound_tok/s;
//   prefill: matrix FLOPs (2 x active matrix parameters per token, lm_head on the last row
//            only, plus the MLA attention products) over the prefill's time: mat_GFLOP/s, and
//            of_sgemm = that / the sgemm peak;
//   memory:  peak_rss (getrusage ru_maxrss; the high-water mark is reset through
//            /proc/self/clear_refs after the machine benchmarks free their buffers, so it
//            covers loading the model and the model runs) against weights_caches (the weights
//            as held + the caches), and resident anonymous / file-backed memory.
// The model directory: --model_dir=DIR, else $K3_BENCH_MODEL, else
// <build dir>/bench-models/mid-1024-mxfp4, created on first use like
// `k3cpp init configs/mid-1024.json DIR --seed 1 --experts mxfp4` (about a minute).
// Own flags (removed before Google Benchmark sees argv): --model_dir=DIR, --model_config=FILE
// (the config for a model that has to be created), --prompt=N (default 128),
// --decode_steps=N (default 128), --prefill_T=N (default 2048), --threads=N (default 2),
// --time=cpu (every time and rate from the benchmark thread's CPU time: with --threads=1, the
// time the work took on one core whatever else a shared machine runs; default wall time).
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kernels/blas_core.h"
#include "infer/session.h"
#include "bench_model.h"
#include "bench_results.h"
#include "machine_peak.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "model/planner.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

std::string g_model_dir, g_model_config;
int64_t g_prompt = 128, g_steps = 128, g_prefill_T = 2048;
int g_threads = 2;
bool g_cpu_time = false;  // --time=cpu

std::string model_dir() { return bench::bench_model_dir(g_model_dir, g_model_config); }

// Resets the resident high-water mark to the current resident size (Linux >= 4.0); false
// where /proc/self/clear_refs cannot be written (then ru_maxrss keeps the whole run's peak).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}
bool g_peak_reset = false;

// Loaded on first use: the machine benchmarks' buffers are freed and the resident peak reset
// first, so that the peak read later is loading plus the model runs.
K3Model& model() {
  static std::unique_ptr<K3Model> m;
  if (!m) {
    bench::release_machine_buffers();
    const std::string dir = model_dir();
    g_peak_reset = reset_peak_rss();
    LoadOptions lo;
    lo.dense_as_stored = true;  // as `k3cpp generate` loads
    m = std::make_unique<K3Model>(load_model(dir, lo));
  }
  return *m;
}

std::vector<int32_t> tokens(int64_t n, int64_t V, uint64_t seed) { return bench::bench_tokens(n, V, seed); }

double peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) * 1024.0;  // Linux: KiB
}

// A "Name:   123 kB" field of /proc/self/status in bytes (VmRSS, RssAnon, RssFile, ...).
double status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key, 0) == 0) return 1024.0 * std::atof(line.c_str() + key.size());
  return NAN;
}

// ---------------------------------------------------------------------------------------
// what a decode token touches, and what the model holds

struct Footprint {
  double dense = 0;         // non-expert weights one token reads as held (embedding: one row)
  double dense_bf16 = 0;    // of which bf16-held matrices
  double experts_tok = 0;   // top-k experts' stored bytes over all MoE layers
  double weights_all = 0;   // every weight as held: the f32 buffer + bf16 matrices + MXFP4 experts
  double expert_all = 0;    // all routed experts (MXFP4 bytes)
};

Footprint footprint(const K3Model& m) {
  const WeightStore& w = m.weights();
  const ParamLayout& lay = w.layout();
  const int64_t k = m.config().num_experts_per_token;
  Footprint f;
  f.weights_all = 4.0 * double(w.size()) + double(w.bf16_bytes());
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& s = lay.spec(i);
    const double elt = lay.bf16_held(i) ? 2.0 : 4.0;  // bytes per element as held
    if (s.component == Component::Embedding) {
      f.dense += elt * double(s.shape[1]);
      if (lay.bf16_held(i)) f.dense_bf16 += elt * double(s.shape[1]);
    } else if (s.component == Component::RoutedExperts) {
      const double b = lay.in_buffer(i) ? 4.0 * double(s.numel())
                                        : double(w.mxfp4(i).packed.nbytes() + w.mxfp4(i).scales.nbytes());
      if (!lay.in_buffer(i)) f.weights_all += b;
      f.expert_all += b;
      if (s.expert < k) f.experts_tok += b;  // k experts' worth per layer (all experts are the same size)
    } else {
      f.dense += elt * double(s.numel());
      if (lay.bf16_held(i)) f.dense_bf16 += elt * double(s.numel());
    }
  }
  return f;
}

// Bytes of the decode caches one step reads (f32 in memory).
double cache_bytes(const DecodeState& st) {
  double b = 0;
  for (const LayerState& l : st.layers) {
    b += 4.0 * double(l.kda.S.size() + l.kda.conv_q.size() + l.kda.conv_k.size() + l.kda.conv_v.size());
    b += 4.0 * double(l.mla.c_kv.size() + l.mla.k_rope.size());
  }
  return b;
}

// ---------------------------------------------------------------------------------------
// results (filled as each benchmark finishes, so later ones can read earlier ones)

using bench::counter;
using bench::rate;
const std::string kSgemm = "machine/sgemm_openblas/2048", kMemRead = "machine/mem_read";
// The decode bound takes the fastest streaming-read pass (wall time) of the run: this VM's
// bandwidth moves by up to 2x with where the host places its two virtual CPUs, and the
// bound should be the machine's capability (in CPU-time mode: the same, per CPU second).
double mem_bandwidth() {
  const double best = counter(kMemRead, "best_B/s"), mean = rate(kMemRead, counter(kMemRead, "bytes"));
  return g_cpu_time || std::isnan(best) ? mean : std::max(best, mean);
}
double sgemm_peak() { return rate(kSgemm, counter(kSgemm, "flop")); }

// Matrix FLOPs of a T-token prefill (planner.h): 2 x active matrix parameters per token plus
// the MLA attention products at context T; the lm_head runs on the last row only.
double prefill_matrix_flops(const K3Config& cfg, int64_t T) {
  const Flops fl = forward_flops_per_token(cfg, T);
  const double lm = 2.0 * double(cfg.vocab_size) * double(cfg.hidden_size);
  return (fl.matmul + fl.mla_attn) * double(T) - lm * double(T - 1);
}

// ---------------------------------------------------------------------------------------
// benchmarks

double g_decode_bytes = NAN, g_decode_cache = NAN, g_prefill_cache = NAN;

double clock_ms() {
  timespec ts{};
  clock_gettime(g_cpu_time ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

void memory_counters(benchmark::State& st, const K3Model& m, double cache) {
  const Footprint f = footprint(m);
  st.counters["peak_rss"] = peak_rss_bytes();
  st.counters["weights_caches"] = f.weights_all + cache;
  // Resident now, split: anonymous (the f32 weight buffer, activations, scratch, allocator)
  // and file-backed (pages of the mmap'ed checkpoint: the MXFP4 experts, and whatever else of
  // the file the loader touched).
  st.counters["rss_anon"] = status_bytes("RssAnon");
  st.counters["rss_file"] = status_bytes("RssFile");
}

void BM_Decode(benchmark::State& st) {
  K3Model& m = model();
  const int64_t V = m.dims().V;
  Session s(m, {KDAPath::Fast, KDAPath::Fast, g_prompt + int64_t(st.max_iterations) + 8});
  s.prefill(tokens(g_prompt, V, 1));
  const std::vector<int32_t> next = tokens(int64_t(st.max_iterations) + 1, V, 2);
  // Per-step times: the median resists the steps that another process's preemption stretched
  // (the cores are shared), which the mean does not.
  std::vector<double> ms;
  ms.reserve(size_t(st.max_iterations));
  size_t i = 0;
  for (auto _ : st) {
    const double t0 = clock_ms();
    benchmark::DoNotOptimize(s.step(next[i++]));
    ms.push_back(clock_ms() - t0);
  }
  double sum = 0;
  for (double x : ms) sum += x;
  std::sort(ms.begin(), ms.end());
  const Footprint f = footprint(m);
  g_decode_cache = cache_bytes(s.state());
  g_decode_bytes = f.dense + f.experts_tok + g_decode_cache;
  const double tok_s = 1e3 * double(ms.size()) / sum, bound = mem_bandwidth() / g_decode_bytes;
  st.counters["tok/s"] = tok_s;
  st.counters["p50_ms"] = ms[ms.size() / 2];
  st.counters["min_ms"] = ms.front();
  st.counters["bytes/tok"] = g_decode_bytes;
  st.counters["bound_tok/s"] = bound;
  st.counters["of_bound"] = tok_s / bound;
  memory_counters(st, m, g_decode_cache);
}

void BM_Prefill(benchmark::State& st) {
  K3Model& m = model();
  const int64_t T = st.range(0);
  Session s(m, {KDAPath::Fast, KDAPath::Fast, T});
  const std::vector<int32_t> ids = tokens(T, m.dims().V, 3);
  double best = INFINITY;
  for (auto _ : st) {
    s.reset();
    const double t0 = clock_ms();
    benchmark::DoNotOptimize(s.prefill(ids));
    best = std::min(best, clock_ms() - t0);
  }
  g_prefill_cache = cache_bytes(s.state());
  const double gflops = prefill_matrix_flops(m.config(), T) / best / 1e6;
  st.counters["tok/s"] = 1e3 * double(T) / best;  // fastest iteration
  st.counters["mat_GFLOP/s"] = gflops;
  st.counters["of_sgemm"] = gflops * 1e9 / sgemm_peak();
  memory_counters(st, m, g_prefill_cache);
}

// ---------------------------------------------------------------------------------------
// summary

void summary() {
  if (bench::results().empty()) return;
  const K3Model& m = model();
  const K3Config& cfg = m.config();
  const Footprint f = footprint(m);
  const double bw = mem_bandwidth(), sgemm = sgemm_peak();
  const std::string dn = "infer/decode", pn = "infer/prefill/" + std::to_string(g_prefill_T);
  std::printf("\n=== Inference (%s: d %ld, %ld layers, %ld experts top-%ld, latent %ld; %d threads, %s time; load"
              " average now %s) ===\n",
              fs::path(model_dir()).filename().c_str(), long(cfg.hidden_size), long(cfg.num_hidden_layers),
              long(cfg.num_experts), long(cfg.num_experts_per_token), long(cfg.routed_expert_hidden_size),
              num_threads(), g_cpu_time ? "thread CPU" : "wall", bench::load_average().c_str());
  blas_choose_core();  // as the products do (kernels/blas_core.h)
  const std::string core = blas_core_name();
  std::printf("machine: streaming read %.2f GB/s (mean of the passes %.2f GB/s); OpenBLAS sgemm 2048 %.1f GFLOP/s"
              " (OpenBLAS kernel: %s)\n",
              bw / 1e9, rate(kMemRead, counter(kMemRead, "bytes")) / 1e9, sgemm / 1e9, core.c_str());
  if (bench::results().count(dn)) {
    const double tok_s = counter(dn, "tok/s"), p50 = counter(dn, "p50_ms"), bound = bw / g_decode_bytes;
    std::printf("decode (after a %ld-token prompt, %ld steps): %.2f tok/s = %.2f ms/token mean; median step %.2f ms"
                " = %.2f tok/s, fastest %.2f ms\n",
                long(g_prompt), long(g_steps), tok_s, 1e3 / tok_s, p50, 1e3 / p50, counter(dn, "min_ms"));
    std::printf("  bytes per token %.1f MB = dense %.1f MB (bf16 matrices %.1f MB, f32 the rest) + top-%ld experts"
                " MXFP4 %.2f MB + caches %.2f MB\n",
                g_decode_bytes / 1e6, f.dense / 1e6, f.dense_bf16 / 1e6, long(cfg.num_experts_per_token),
                f.experts_tok / 1e6, g_decode_cache / 1e6);
    std::printf("  bandwidth bound %.2f tok/s; achieved %.1f%% of the bound by the mean (target >= 50%%), %.1f%% by"
                " the median step; effective %.2f GB/s (mean)\n",
                bound, 100 * tok_s / bound, 100 * 1e3 / p50 / bound, tok_s * g_decode_bytes / 1e9);
  }
  if (bench::results().count(pn)) {
    const double tok_s = counter(pn, "tok/s"), mat = prefill_matrix_flops(cfg, g_prefill_T);
    std::printf("prefill T=%ld: %.1f tok/s = %.3f s; matrix work %.1f GFLOP (2 x active matrix params per token +"
                " MLA attention) -> %.1f GFLOP/s = %.1f%% of the sgemm peak (target >= 60%% on AVX2, 75%% on AVX-512)\n",
                long(g_prefill_T), tok_s, double(g_prefill_T) / tok_s, mat / 1e9, counter(pn, "mat_GFLOP/s"),
                100 * counter(pn, "mat_GFLOP/s") * 1e9 / sgemm);
  }
  for (const std::string& name : {dn, pn}) {
    if (!bench::results().count(name)) continue;
    const double cache = name == dn ? g_decode_cache : g_prefill_cache;
    std::printf("memory after %s: peak RSS %.1f MB (%s); weights as held %.1f MB (dense f32 + bf16 %.1f MB + MXFP4 experts"
                " %.1f MB) + caches %.2f MB = %.1f MB; peak / (weights + caches) = %.2f; resident now: anonymous"
                " %.1f MB, file-backed %.1f MB\n",
                name.c_str(), counter(name, "peak_rss") / 1e6,
                g_peak_reset ? "since the model load" : "whole run: clear_refs unavailable", f.weights_all / 1e6,
                (f.weights_all - f.expert_all) / 1e6, f.expert_all / 1e6, cache / 1e6,
                counter(name, "weights_caches") / 1e6, counter(name, "peak_rss") / counter(name, "weights_caches"),
                counter(name, "rss_anon") / 1e6, counter(name, "rss_file") / 1e6);
  }
}

void register_all() {
  bench::register_machine_peaks(2048);
  benchmark::RegisterBenchmark("infer/decode", BM_Decode)->Iterations(g_steps)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("infer/prefill", BM_Prefill)
      ->Arg(g_prefill_T)
      ->Iterations(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  bench::take_own_flags(argc, argv, [](const std::string& a, auto val) {
    if (const char* v = val("--model_dir=")) g_model_dir = v;
    else if (const char* v = val("--model_config=")) g_model_config = v;
    else if (const char* v = val("--prompt=")) g_prompt = std::stoll(v);
    else if (const char* v = val("--decode_steps=")) g_steps = std::stoll(v);
    else if (const char* v = val("--prefill_T=")) g_prefill_T = std::stoll(v);
    else if (const char* v = val("--threads=")) g_threads = std::stoi(v);
    else if (a == "--time=cpu") g_cpu_time = bench::use_cpu_time() = true;
    else return false;
    return true;
  });
  set_num_threads(g_threads);
  std::printf("load average at start: %s\n", bench::load_average().c_str());
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bench::Capture rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  summary();
  benchmark::Shutdown();
  return 0;
}
