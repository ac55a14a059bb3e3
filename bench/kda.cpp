// Benchmarks of the fast chunked KDA kernel (kernels/kda_fast.h; docs/benchmarks.md, section
// "KDA chunked kernel") and the numerics experiment of docs/kda-numerics.md. One sequence,
// H = 8 heads, D = Dk = Dv = 128, bounded gates (g in (-5, 0)):
//   machine/*  measured in the same run: register-only FMA and bf16-dot peaks, OpenBLAS sgemm
//              2048^3, memory bandwidth (in-place read+write, the decode step's pattern);
//   kda/*      recurrent forward (plain reference; the vectorised decode step in a loop),
//              chunked fast forward (inference, and training with saved workspace) and
//              backward, f32 and bf16, T in --kda_T (default 2048,16384,65536);
//   decode/*   one token for 8 heads, state hot in cache, and cold (96 layers' states cycled).
// After the runs a summary prints every ratio docs/benchmarks.md reports, then times the
// PyTorch chunked KDA (tools/kda_torch_bench.py, /usr/bin/python3) on the same inputs and
// checks its output against this kernel's.
// Own flags (removed before Google Benchmark sees argv): --kda_T=LIST, --kda_torch=0,
// --kda_time=cpu (summary from thread CPU time: for OMP_NUM_THREADS=1 on a shared machine),
// --kda_numerics (run the experiment instead of the benchmarks), --kda_numerics_T=LIST,
// --kda_numerics_H=N.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_results.h"
#include "machine_peak.h"
#include "core/dtype.h"
#include "core/threads.h"
#include "kernels/blas_core.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/kda_fast.h"
#include "kernels/matmul_bf16.h"

using namespace k3;

namespace {

constexpr int64_t kH = 8, kD = 128;
std::vector<int64_t> g_T = {2048, 16384, 65536};

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> r;
  for (std::stringstream ss(s); ss.good();) {
    std::string x;
    std::getline(ss, x, ',');
    if (!x.empty()) r.push_back(std::stoll(x));
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// inputs: q, k unit rows, v ~ U(-1.7, 1.7), beta ~ U(0, 1), g = -5 u^2 (bounded)

struct Rng {
  uint64_t s;
  float uni() {  // splitmix64 -> [0, 1)
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return float((z ^ (z >> 31)) >> 40) * 0x1p-24f;
  }
};

struct Data {
  int64_t T;
  std::vector<float> q, k, v, g, beta, o, s, dO, dq, dk, dv, dg, db, ds0;
};

Data& data(int64_t T) {
  static std::map<int64_t, std::unique_ptr<Data>> cache;
  auto& p = cache[T];
  if (p) return *p;
  p = std::make_unique<Data>();
  Data& d = *p;
  d.T = T;
  const int64_t n = T * kH * kD;
  for (auto* x : {&d.q, &d.k, &d.v, &d.g, &d.o, &d.dO, &d.dq, &d.dk, &d.dv, &d.dg}) x->resize(n);
  d.beta.resize(T * kH), d.db.resize(T * kH), d.s.assign(kH * kD * kD, 0.f), d.ds0.resize(kH * kD * kD);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < T * kH; ++r) {
    Rng rng{uint64_t(r) * 7919 + 1};
    for (auto* x : {&d.q, &d.k}) {
      float ss = 0;
      for (int64_t c = 0; c < kD; ++c) ss += ((*x)[r * kD + c] = rng.uni() - 0.5f) * (*x)[r * kD + c];
      for (int64_t c = 0; c < kD; ++c) (*x)[r * kD + c] /= std::sqrt(ss);
    }
    for (int64_t c = 0; c < kD; ++c) {
      d.v[r * kD + c] = 3.4f * (rng.uni() - 0.5f);
      const float u = rng.uni();
      d.g[r * kD + c] = -5.f * u * u;
      d.dO[r * kD + c] = rng.uni() - 0.5f;
    }
    d.beta[r] = rng.uni();
  }
  return d;
}

double scale() { return 1.0 / std::sqrt(double(kD)); }

// ---------------------------------------------------------------------------------------
// machine peaks


// The tile products alone, one thread (kernels/matmul_bf16.h): args M, N, K, bf16, tri.
void BM_Tile(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  const bool bf = st.range(3);
  const Tri tri = st.range(4) ? Tri::Lower : Tri::None;
  std::vector<float> A(M * K, 0.01f), B(K * N, 0.02f), C(M * N);
  std::vector<uint16_t> Ah(M * K), Bp(K * N + 2 * N);
  to_bf16(Ah.data(), K, A.data(), K, M, K);
  pack_vnni(Bp.data(), N, B.data(), N, K, N);
  for (auto _ : st) {
    if (bf)
      mm_bf16(C.data(), N, Ah.data(), K, Bp.data(), N, M, N, K, 1.f, false, tri);
    else
      mm_f32(C.data(), N, A.data(), K, false, B.data(), N, M, N, K, 1.f, false, tri);
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * N * (tri == Tri::Lower ? double(M) * (M + 16) / 2 : double(M) * K);
  st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------------------
// KDA

void counters(benchmark::State& st, int64_t T, double flops) {
  st.counters["tok/s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
  if (flops > 0) st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_RecurrentRef(benchmark::State& st) {
  Data& d = data(st.range(0));
  for (auto _ : st) {
    std::fill(d.s.begin(), d.s.end(), 0.f);
    kda_recurrent_forward<float>(d.o.data(), d.s.data(), d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.beta.data(),
                                 d.T, kH, kD, kD, scale());
  }
  counters(st, d.T, 0);
}

void BM_RecurrentFast(benchmark::State& st) {  // the vectorised decode step over the sequence
  Data& d = data(st.range(0));
  const int64_t n = kH * kD;
  for (auto _ : st) {
    std::fill(d.s.begin(), d.s.end(), 0.f);
    for (int64_t t = 0; t < d.T; ++t)
      kda_decode_step_fast(d.o.data() + t * n, d.s.data(), d.q.data() + t * n, d.k.data() + t * n, d.v.data() + t * n,
                           d.g.data() + t * n, d.beta.data() + t * kH, kH, kD, kD, scale());
  }
  counters(st, d.T, 0);
}

void BM_ChunkRef(benchmark::State& st) {
  Data& d = data(st.range(0));
  for (auto _ : st) {
    std::fill(d.s.begin(), d.s.end(), 0.f);
    kda_chunk_forward<float>(d.o.data(), d.s.data(), d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.beta.data(),
                             d.T, kH, kD, kD, scale(), 64);
  }
  counters(st, d.T, 0);
}

KDAFastOptions fast_opts(int64_t bf16, int64_t chunk, bool save, bool safe = false) {
  KDAFastOptions o;
  o.bf16 = bf16;
  o.chunk = chunk;
  o.save_for_backward = save;
  if (safe) o.diag = KDAFastOptions::DiagPath::Safe;
  return o;
}

// args: T, bf16, chunk, mode (0 inference forward, 1 training forward (saves), 2 safe path)
void BM_FastForward(benchmark::State& st) {
  Data& d = data(st.range(0));
  const KDAFastOptions opt = fast_opts(st.range(1), st.range(2), st.range(3) == 1, st.range(3) == 2);
  KDAWorkspace ws;
  kda_chunk_fast_forward(d.o.data(), d.s.data(), d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.beta.data(), d.T,
                         kH, kD, kD, scale(), opt, ws);  // first touch of the workspace's pages, untimed
  for (auto _ : st) {
    std::fill(d.s.begin(), d.s.end(), 0.f);
    kda_chunk_fast_forward(d.o.data(), d.s.data(), d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.beta.data(), d.T,
                           kH, kD, kD, scale(), opt, ws);
  }
  counters(st, d.T, kda_chunk_fast_flops(d.T, kH, kD, kD, opt.chunk, false));
}

// args: T, bf16, chunk
void BM_FastBackward(benchmark::State& st) {
  Data& d = data(st.range(0));
  const KDAFastOptions opt = fast_opts(st.range(1), st.range(2), true);
  KDAWorkspace ws;
  std::vector<float> s0(kH * kD * kD, 0.f);
  std::fill(d.s.begin(), d.s.end(), 0.f);
  kda_chunk_fast_forward(d.o.data(), d.s.data(), d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.beta.data(), d.T, kH,
                         kD, kD, scale(), opt, ws);
  for (auto _ : st)
    kda_chunk_fast_backward(d.dq.data(), d.dk.data(), d.dv.data(), d.dg.data(), d.db.data(), d.ds0.data(), d.dO.data(),
                            nullptr, d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.beta.data(), s0.data(), d.T, kH,
                            kD, kD, scale(), opt, ws);
  counters(st, d.T, kda_chunk_fast_flops(d.T, kH, kD, kD, opt.chunk, true));
}

// args: layers (1: hot, the same 8 heads' state every step; 96: cold, one state per layer)
void BM_Decode(benchmark::State& st) {
  const int64_t L = st.range(0), n = kH * kD;
  Data& d = data(2048);
  std::vector<float> states(L * kH * kD * kD, 0.f), o(n);
  for (auto _ : st)
    for (int64_t l = 0; l < L; ++l) {
      const int64_t t = l % d.T;
      kda_decode_step_fast(o.data(), states.data() + l * kH * kD * kD, d.q.data() + t * n, d.k.data() + t * n,
                           d.v.data() + t * n, d.g.data() + t * n, d.beta.data() + t * kH, kH, kD, kD, scale());
    }
  const double bytes = 2.0 * 4 * kH * kD * kD * L;  // each state read once and written once
  st.counters["B/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["steps/s"] = benchmark::Counter(double(L), benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------------------
// results and summary

struct Result {
  double real_s, cpu_s;
  std::map<std::string, double> c;
};
std::map<std::string, Result> g_res;
// --kda_time=cpu: rates and ratios from the benchmark thread's CPU time instead of wall time;
// with OMP_NUM_THREADS=1 that is the time the work itself took, whatever else runs on the
// machine (a shared machine's time slices are not counted).
bool g_cpu_time = false;
double t_of(const Result& r) { return g_cpu_time ? r.cpu_s : r.real_s; }

class Capture : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.error_occurred || r.iterations == 0) continue;
      Result x{r.real_accumulated_time / double(r.iterations), r.cpu_accumulated_time / double(r.iterations), {}};
      for (const auto& [k, v] : r.counters) x.c[k] = v.value;
      std::string name = r.benchmark_name();
      if (const auto at = name.find("/real_time"); at != std::string::npos) name.erase(at);
      if (r.run_type != Run::RT_Iteration) continue;
      auto it = g_res.find(name);  // with --benchmark_repetitions: keep the best run
      if (it == g_res.end() || t_of(x) < t_of(it->second)) g_res[name] = x;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

const Result* res(const std::string& name) {
  auto it = g_res.find(name);
  return it == g_res.end() ? nullptr : &it->second;
}
double counter(const std::string& name, const char* c) {  // rates are per wall second; rescaled
  const Result* r = res(name);
  return r && r->c.count(c) ? r->c.at(c) * r->real_s / t_of(*r) : NAN;
}
std::string fwd_name(int64_t T, int bf, int64_t C, int mode) {
  return "kda/fast_fwd/T:" + std::to_string(T) + "/bf16:" + std::to_string(bf) + "/chunk:" + std::to_string(C) +
         "/mode:" + std::to_string(mode);
}
std::string bwd_name(int64_t T, int bf, int64_t C) {
  return "kda/fast_bwd/T:" + std::to_string(T) + "/bf16:" + std::to_string(bf) + "/chunk:" + std::to_string(C);
}
std::string load_avg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

double rel_rms(const float* a, const float* b, int64_t n) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) e += double(a[i] - b[i]) * (a[i] - b[i]), r += double(b[i]) * b[i];
  return std::sqrt(e / r);
}

// PyTorch chunked KDA on the same inputs: seconds (best of its repeats), and rel. RMS of its
// output against this kernel's f32 output; NAN when python/torch is unavailable.
std::pair<double, double> torch_run(int64_t T) {
  Data& d = data(T);
  std::string src = __FILE__;
  src = src.substr(0, src.rfind('/'));
  src = src.substr(0, src.rfind('/'));
  char tmpl[] = "/tmp/kda_torch_XXXXXX";
  if (!mkdtemp(tmpl)) return {NAN, NAN};
  const std::string dir = tmpl;
  auto dump = [&](const char* name, const std::vector<float>& x) {
    std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(x.data()), x.size() * 4);
  };
  dump("q.bin", d.q), dump("k.bin", d.k), dump("v.bin", d.v), dump("g.bin", d.g), dump("beta.bin", d.beta);
  const std::string cmd = "/usr/bin/python3 " + src + "/tools/kda_torch_bench.py --dir " + dir +
                          " --T " + std::to_string(T) + " --H " + std::to_string(kH) + " --D " + std::to_string(kD) +
                          " --threads " + std::to_string(num_threads()) + " --repeats " + (T > 4096 ? "1" : "3");
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  double sec = NAN, err = NAN;
  const std::string key = g_cpu_time ? "\"cpu_seconds\": " : "\"seconds\": ";
  const auto at = out.find(key);
  if (at != std::string::npos) {
    sec = std::atof(out.c_str() + at + key.size());
    std::vector<float> ot(d.o.size()), s(kH * kD * kD, 0.f);
    std::ifstream(dir + "/o_torch.bin", std::ios::binary).read(reinterpret_cast<char*>(ot.data()), ot.size() * 4);
    KDAWorkspace ws;
    kda_chunk_fast_forward(d.o.data(), s.data(), d.q.data(), d.k.data(), d.v.data(), d.g.data(), d.beta.data(), T, kH,
                           kD, kD, scale(), fast_opts(0, 64, false), ws);
    err = rel_rms(ot.data(), d.o.data(), int64_t(ot.size()));
  } else {
    std::printf("  (PyTorch run failed: %s)\n", out.c_str());
  }
  for (const char* f : {"q.bin", "k.bin", "v.bin", "g.bin", "beta.bin", "o_torch.bin", "state_torch.bin"})
    std::remove((dir + "/" + f).c_str());
  rmdir(dir.c_str());
  return {sec, err};
}

void summary(bool with_torch) {
  const double fma = counter("machine/fma_peak/bf16:0", "FLOP/s"), dot = counter("machine/fma_peak/bf16:1", "FLOP/s");
  const double sgemm = counter("machine/sgemm_openblas/2048", "FLOP/s"), bw = counter("machine/mem_rw", "B/s");
  blas_choose_core();  // as the products do (kernels/blas_core.h)
  const std::string core = blas_core_name();
  std::printf("\n=== KDA chunked kernel: summary (H=%ld, D=%ld, %d threads, %s time, load average now %s) ===\n",
              kH, kD, num_threads(), g_cpu_time ? "thread CPU" : "wall", load_avg().c_str());
  std::printf("machine: f32 FMA peak %.1f GFLOP/s, bf16 dot peak %.1f GFLOP/s, OpenBLAS sgemm 2048 %.1f GFLOP/s"
              " (OpenBLAS kernel: %s), memory read+write %.1f GB/s\n",
              fma / 1e9, dot / 1e9, sgemm / 1e9, core.c_str(), bw / 1e9);
  std::printf("tile products, one thread, GFLOP/s f32 / bf16:");
  for (auto sh : {"M:128/N:128/K:128", "M:64/N:128/K:64", "M:32/N:64/K:128", "M:32/N:16/K:128"})
    std::printf("  %s %.0f / %.0f", sh, counter(std::string("tile/") + sh + "/bf16:0/tri:" + (sh[2] == '6' ? "1" : "0"), "FLOP/s") / 1e9,
                counter(std::string("tile/") + sh + "/bf16:1/tri:" + (sh[2] == '6' ? "1" : "0"), "FLOP/s") / 1e9);
  std::printf("\n");
  std::printf("\n%7s | %10s %10s | %10s %10s %8s %8s | %9s %6s %6s | %8s | %7s %7s\n", "T", "rec tok/s",
              "recF tok/s", "f32 tok/s", "bf16 tok/s", "f32/rec", "f32/recF", "f32 GF/s", "%sgemm", "%FMA",
              "bf16/f32", "bwd/fwd", "bwd/fwdT");
  for (int64_t T : g_T) {
    const double rec = counter("kda/recurrent_ref/" + std::to_string(T), "tok/s"),
                 recf = counter("kda/recurrent_fast/" + std::to_string(T), "tok/s");
    const double f = counter(fwd_name(T, 0, 64, 0), "tok/s"), b = counter(fwd_name(T, 1, 64, 0), "tok/s");
    const double gf = counter(fwd_name(T, 0, 64, 0), "FLOP/s");
    const Result *fw = res(fwd_name(T, 0, 64, 0)), *fwt = res(fwd_name(T, 0, 64, 1)), *bw32 = res(bwd_name(T, 0, 64));
    std::printf("%7ld | %10.0f %10.0f | %10.0f %10.0f %7.1fx %7.1fx | %9.1f %5.0f%% %5.0f%% | %7.2fx | %6.2fx %6.2fx\n", T,
                rec, recf, f, b, f / rec, f / recf, gf / 1e9, 100 * gf / sgemm, 100 * gf / fma, b / f,
                bw32 && fw ? t_of(*bw32) / t_of(*fw) : NAN, bw32 && fwt ? t_of(*bw32) / t_of(*fwt) : NAN);
  }
  std::printf("(rec = kda_recurrent_forward<float>, recF = kda_decode_step_fast per token; bwd/fwd: f32 backward time"
              " over the inference forward, bwd/fwdT: over the training forward that saves the workspace)\n");
  for (int64_t T : g_T) {
    const Result *fb = res(fwd_name(T, 1, 64, 0)), *fbt = res(fwd_name(T, 1, 64, 1)), *bb = res(bwd_name(T, 1, 64));
    if (fb && bb)
      std::printf("bf16 T=%ld: backward %.1f ms = %.2fx forward (%.2fx training forward); backward %.1f GFLOP/s\n", T,
                  t_of(*bb) * 1e3, t_of(*bb) / t_of(*fb), fbt ? t_of(*bb) / t_of(*fbt) : NAN,
                  counter(bwd_name(T, 1, 64), "FLOP/s") / 1e9);
  }
  const double hot = counter("decode/layers:1", "B/s"), cold = counter("decode/layers:96", "B/s");
  std::printf("decode step (8 heads, %.2f MB of state read + written per step): hot %.1f GB/s (%.0f%% of memory"
              " bandwidth, %.0f steps/s), cold %.1f GB/s (%.0f%%, %.0f steps/s)\n",
              2.0 * 4 * kH * kD * kD / 1e6, hot / 1e9, 100 * hot / bw, counter("decode/layers:1", "steps/s"),
              cold / 1e9, 100 * cold / bw, counter("decode/layers:96", "steps/s"));
  if (!with_torch) return;
  std::printf("\nPyTorch chunked KDA (tools/kda_torch_bench.py, f32, %d threads, %s time) on the same inputs:\n",
              num_threads(), g_cpu_time ? "process CPU" : "wall");
  for (int64_t T : g_T) {
    const auto [sec, err] = torch_run(T);
    const double f = counter(fwd_name(T, 0, 64, 0), "tok/s"), b = counter(fwd_name(T, 1, 64, 0), "tok/s");
    std::printf("T=%ld: torch %.3f s = %.0f tok/s; this kernel f32 %.1fx, bf16 %.1fx faster; rel. RMS (torch o vs"
                " kernel o) %.2e\n",
                T, sec, T / sec, f * sec / T, b * sec / T, err);
  }
}

void register_all() {
  benchmark::RegisterBenchmark("machine/fma_peak", bench::BM_MachineFma)->Arg(0)->Arg(1)->ArgName("bf16")->UseRealTime();
  benchmark::RegisterBenchmark("machine/sgemm_openblas", bench::BM_MachineSgemm)->Arg(2048)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("machine/mem_rw", bench::BM_MachineMemReadWrite)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (int64_t bf : {0, 1})  // the chunk's products: state read, triangular, tile row, small tile
    for (auto sh : {std::vector<int64_t>{128, 128, 128, bf, 0}, {64, 128, 64, bf, 1}, {32, 64, 128, bf, 0},
                    {32, 16, 128, bf, 0}})
      benchmark::RegisterBenchmark("tile", BM_Tile)->Args(sh)->ArgNames({"M", "N", "K", "bf16", "tri"})->UseRealTime();
  for (int64_t T : g_T) {
    benchmark::RegisterBenchmark("kda/recurrent_ref", BM_RecurrentRef)->Arg(T)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("kda/recurrent_fast", BM_RecurrentFast)->Arg(T)->UseRealTime()->Unit(benchmark::kMillisecond);
    if (T <= 2048)
      benchmark::RegisterBenchmark("kda/chunk_ref", BM_ChunkRef)->Arg(T)->UseRealTime()->Unit(benchmark::kMillisecond);
    for (int64_t bf : {0, 1}) {
      for (int64_t mode : {0, 1})
        benchmark::RegisterBenchmark("kda/fast_fwd", BM_FastForward)
            ->Args({T, bf, 64, mode})->ArgNames({"T", "bf16", "chunk", "mode"})->UseRealTime()->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark("kda/fast_bwd", BM_FastBackward)
          ->Args({T, bf, 64})->ArgNames({"T", "bf16", "chunk"})->UseRealTime()->Unit(benchmark::kMillisecond);
    }
    if (T == 16384) {  // the Safe diagonal path and chunk 32, for the record
      benchmark::RegisterBenchmark("kda/fast_fwd", BM_FastForward)
          ->Args({T, 0, 64, 2})->ArgNames({"T", "bf16", "chunk", "mode"})->UseRealTime()->Unit(benchmark::kMillisecond);
      for (int64_t bf : {0, 1})
        benchmark::RegisterBenchmark("kda/fast_fwd", BM_FastForward)
            ->Args({T, bf, 32, 0})->ArgNames({"T", "bf16", "chunk", "mode"})->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("decode", BM_Decode)->Arg(1)->Arg(96)->ArgName("layers")->UseRealTime();
}

// ---------------------------------------------------------------------------------------
// numerics experiment (docs/kda-numerics.md)

struct NumIn {
  int64_t T, H;
  std::vector<double> q, k, v, g, beta;
};

// mode 0: K3 gate g = -5 sigmoid(a (z + b)) with half of the channels pinned at the floor -5;
// mode 1: every channel of every token at -5; mode 2: Kimi Linear gate g = -e^A softplus(z + b)
// with a quarter of the channels near -30 (strong decay). Values rounded to bf16.
NumIn num_inputs(int64_t T, int64_t H, int mode) {
  NumIn in{T, H, {}, {}, {}, {}, {}};
  const int64_t n = T * H * kD;
  in.q.resize(n), in.k.resize(n), in.v.resize(n), in.g.resize(n), in.beta.resize(T * H);
  auto r16 = [](double x) { return double(bf16_to_f32(f32_to_bf16(float(x)))); };
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < T * H; ++r) {
    Rng rng{uint64_t(r) * 104729 + 17 + uint64_t(mode)};
    for (auto* x : {&in.q, &in.k}) {
      double ss = 0;
      for (int64_t c = 0; c < kD; ++c) ss += ((*x)[r * kD + c] = rng.uni() - 0.5) * (*x)[r * kD + c];
      for (int64_t c = 0; c < kD; ++c) (*x)[r * kD + c] = r16((*x)[r * kD + c] / std::sqrt(ss));
    }
    for (int64_t c = 0; c < kD; ++c) {
      in.v[r * kD + c] = r16(3.4 * (rng.uni() - 0.5));
      const double z = 6.0 * (rng.uni() - 0.5);
      double g = mode == 2 ? -std::log1p(std::exp(z)) : -5.0 / (1 + std::exp(-z));
      if (mode == 0 && c % 2 == 0) g = -5.0;
      if (mode == 1) g = -5.0;
      if (mode == 2 && c % 4 == 0) g = -30.0 + 2 * (rng.uni() - 0.5);
      in.g[r * kD + c] = r16(g);
    }
    in.beta[r] = r16(rng.uni());
  }
  return in;
}

double max_anchor_exponent(const NumIn& in) {  // |G_i - G_mid| over the dense path's tiles
  double worst = 0;
#pragma omp parallel for reduction(max : worst) schedule(static)
  for (int64_t h = 0; h < in.H; ++h)
    for (int64_t b0 = 0; b0 < in.T; b0 += 16)
      for (int64_t d = 0; d < kD; ++d) {
        const int64_t m = b0 + 8;
        auto g = [&](int64_t t) { return t < in.T ? in.g[(t * in.H + h) * kD + d] : 0.0; };
        double up = 0, down = 0;  // rows below the anchor: sum of g in (m, i]; above: in (i, m]
        for (int64_t i = m + 1; i < b0 + 16; ++i) worst = std::max(worst, std::abs(up += g(i)));
        for (int64_t i = m - 1; i >= b0; --i) worst = std::max(worst, std::abs(down += g(i + 1)));
      }
  return worst;
}

int run_numerics(const std::vector<int64_t>& Ts, int64_t H) {
  std::printf("KDA numerics (docs/kda-numerics.md): H=%ld, D=%ld, inputs rounded to bf16, reference = the double"
              " recurrence on the same values; %d threads\n",
              H, kD, num_threads());
  std::printf("%-30s %7s %8s | %-11s %9s %9s %9s %8s\n", "gates", "T", "max|exp|", "kernel", "rel o", "rel S",
              "max|do|", "nonfinite");
  const char* names[] = {"K3 gate, half pinned at -5", "all channels at -5", "unbounded, strong decay"};
  for (int mode : {0, 1, 2})
    for (int64_t T : Ts) {
      if (mode == 2 && T > 4096) continue;
      const NumIn in = num_inputs(T, H, mode);
      const double sc = scale();
      std::vector<double> o(T * H * kD), s(H * kD * kD, 0.0);
      kda_recurrent_forward<double>(o.data(), s.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                    in.beta.data(), T, H, kD, kD, sc);
      auto F = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
      const auto q = F(in.q), k = F(in.k), v = F(in.v), g = F(in.g), b = F(in.beta);
      const auto of = F(o), sf = F(s);
      const double mx = max_anchor_exponent(in);
      for (auto [bf, diag] : {std::pair<int, KDAFastOptions::DiagPath>{1, KDAFastOptions::DiagPath::Dense},
                              {0, KDAFastOptions::DiagPath::Dense}, {1, KDAFastOptions::DiagPath::Safe},
                              {0, KDAFastOptions::DiagPath::Safe}}) {
        KDAFastOptions opt;
        opt.bf16 = bf;
        opt.diag = diag;
        KDAWorkspace ws;
        std::vector<float> ok(T * H * kD), sk(H * kD * kD, 0.f);
        kda_chunk_fast_forward(ok.data(), sk.data(), q.data(), k.data(), v.data(), g.data(), b.data(), T, H, kD, kD, sc,
                               opt, ws);
        int64_t bad = 0;
        double maxd = 0;
        for (int64_t i = 0; i < int64_t(ok.size()); ++i) {
          if (!std::isfinite(ok[i])) ++bad;
          else maxd = std::max(maxd, std::abs(double(ok[i]) - o[i]));
        }
        const std::string kern = std::string(bf ? "bf16 " : "f32  ") + (diag == KDAFastOptions::DiagPath::Dense ? "dense" : "safe");
        std::printf("%-30s %7ld %8.1f | %-11s %9.2e %9.2e %9.2e %8ld\n", names[mode], T, mx, kern.c_str(),
                    rel_rms(ok.data(), of.data(), int64_t(of.size())), rel_rms(sk.data(), sf.data(), int64_t(sf.size())),
                    maxd, bad);
      }
      std::fflush(stdout);
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  set_num_threads(0);
  bool torch = true, numerics = false;
  std::vector<int64_t> numT = {1024, 4096, 16384, 65536};
  int64_t numH = 2;
  bench::take_own_flags(argc, argv, [&](const std::string& a, auto val) {
    if (const char* v = val("--kda_T=")) g_T = parse_list(v);
    else if (a == "--kda_torch=0") torch = false;
    else if (a == "--kda_time=cpu") g_cpu_time = true;
    else if (a == "--kda_numerics") numerics = true;
    else if (const char* v = val("--kda_numerics_T=")) numT = parse_list(v);
    else if (const char* v = val("--kda_numerics_H=")) numH = std::stoll(v);
    else return false;
    return true;
  });
  if (numerics) return run_numerics(numT, numH);
  std::printf("load average at start: %s\n", load_avg().c_str());
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Capture rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  summary(torch);
  benchmark::Shutdown();
  return 0;
}
