// Machine peaks measured inside a benchmark run, shared by the bench_* binaries so that every
// ratio in docs/benchmarks.md is taken against figures from the same run and machine state:
//   BM_MachineSgemm       OpenBLAS sgemm N x N x N (the f32 matrix-multiply peak the prefill
//                         targets are stated against), counter "FLOP/s";
//   BM_MachineFma         register-only FMA chains on the dispatched SIMD target, all threads
//                         (the peak the KDA kernel's figures are stated against), "FLOP/s";
//   BM_MachineMemRead     streaming read of a 1 GiB buffer, vector loads of the dispatched SIMD
//                         target, 8 accumulators per thread (the decode bound: weights are only
//                         read), counters "B/s" (mean over the passes) and "best_B/s" (the
//                         fastest pass);
//   BM_MachineMemReadWrite in-place read + write of 512 MiB (a state-update pattern), "B/s".
// All run with the OpenMP thread count (k3::num_threads()); besides the rates (per wall second)
// each reports its work per iteration ("flop", "bytes") so that a summary can take rates from
// CPU time instead. Header-only (inline) so that a bench file can include it without a
// library; names live in k3::bench.
#pragma once
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/simd_target.h"
#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/machine_probe.h"

namespace k3::bench {

// "1.23 0.98 0.75": the 1, 5 and 15 minute load averages (other processes sharing the cores
// move every figure; the summaries print this next to them).
inline std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

inline void BM_MachineSgemm(benchmark::State& st) {
  const int64_t N = st.range(0);
  std::vector<float> A(size_t(N * N), 0.5f), B(size_t(N * N), 0.25f), C(size_t(N * N));
  for (auto _ : st) gemm(false, false, N, N, N, 1.f, A.data(), N, B.data(), N, 0.f, C.data(), N);
  st.counters["FLOP/s"] = benchmark::Counter(2.0 * N * N * N, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["flop"] = 2.0 * N * N * N;  // per iteration (for rates from another clock)
}

// The first line of every benchmark log: the CPU and the SIMD target the kernels dispatch to
// (K3_SIMD_TARGET forces a lower one; applied here too, since this initialiser may run before
// core's own, and applying it twice is the same).
inline const bool kPrintedMachine = [] {
  try {
    apply_simd_target_from_env();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3cpp benchmark: error: %s\n", e.what());
    std::exit(2);
  }
  std::printf("k3cpp benchmark: %s\n", machine_summary().c_str());
  std::fflush(stdout);
  return true;
}();

inline void BM_MachineFma(benchmark::State& st) {
  const int64_t n = 1 << 22;
  const bool bf = st.range(0);
  double flops = 0;
  for (auto _ : st) {
    double per = 0;
#pragma omp parallel reduction(+ : per)
    {
      float sink;
      per += bf ? bf16_dot_peak_loop(n, &sink) : fma_peak_loop(n, &sink);
      benchmark::DoNotOptimize(sink);
    }
    flops = per;
  }
  st.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name);
}

// The buffers the memory benchmarks keep between their calls (Google Benchmark calls a
// function several times); release_machine_buffers() frees them, e.g. before a resident-memory
// measurement.
struct MachineBuffers {
  Tensor read;               // BM_MachineMemRead: 1 GiB, filled
  std::vector<float> rw;     // BM_MachineMemReadWrite: 512 MiB
};
inline MachineBuffers& machine_buffers() {
  static MachineBuffers b;
  return b;
}
inline void release_machine_buffers() {
  machine_buffers().read = Tensor();
  std::vector<float>().swap(machine_buffers().rw);
}

inline void BM_MachineMemRead(benchmark::State& st) {
  const int64_t n = int64_t(1) << 28;  // 1 GiB of f32: far beyond any cache
  // Owned, 64-byte aligned; first touched by the threads that read it (and with non-zero
  // values: untouched pages would all map the one zero page and read from cache).
  Tensor& buf = machine_buffers().read;
  if (!buf.defined() || buf.numel() != n) {
    buf = Tensor::empty(DType::F32, {n});
    float* q = buf.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) q[i] = float(i & 1023) * 1e-3f;
  }
  const float* p = buf.data<float>();
  double best_s = INFINITY;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t per = (n / nt) & ~int64_t(127);  // the same static split as the fill
      const int64_t begin = per * t, len = t == nt - 1 ? n - begin : per;
      total += stream_sum(p + begin, len);
    }
    benchmark::DoNotOptimize(total);
    best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  st.counters["B/s"] = benchmark::Counter(4.0 * double(n), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["bytes"] = 4.0 * double(n);  // per iteration
  // The fastest pass (wall time): on a VM the bandwidth a pass gets moves with where the host
  // runs the virtual CPUs and with its other tenants; the best pass is the machine's capability.
  st.counters["best_B/s"] = 4.0 * double(n) / best_s;
}

inline void BM_MachineMemReadWrite(benchmark::State& st) {
  const int64_t n = int64_t(1) << 27;  // 512 MiB
  std::vector<float>& a = machine_buffers().rw;
  if (a.size() != size_t(n)) a.assign(size_t(n), 1.f);
  for (auto _ : st) {
    float* p = a.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * 0.999999f + 1e-7f;
    benchmark::ClobberMemory();
  }
  st.counters["B/s"] = benchmark::Counter(2.0 * 4 * n, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["bytes"] = 2.0 * 4 * n;  // per iteration
}

// Registers the peaks under machine/ (sgemm at N = sgemm_n).
inline void register_machine_peaks(int64_t sgemm_n = 2048, bool read_write = false, bool fma = false) {
  if (fma) benchmark::RegisterBenchmark("machine/fma_peak", BM_MachineFma)->Arg(0)->Arg(1)->ArgName("bf16")->UseRealTime();
  benchmark::RegisterBenchmark("machine/sgemm_openblas", BM_MachineSgemm)
      ->Arg(sgemm_n)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("machine/mem_read", BM_MachineMemRead)->UseRealTime()->Unit(benchmark::kMillisecond);
  if (read_write)
    benchmark::RegisterBenchmark("machine/mem_rw", BM_MachineMemReadWrite)->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace k3::bench
