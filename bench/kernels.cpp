// Kernel benchmark on the dispatched SIMD target (docs/benchmarks.md, "SIMD targets"): the hot
// inference kernels one at a time, single thread, on decode-sized shapes, so one run per target
// (K3_SIMD_TARGET=avx2|sse4|scalar ..., scripts/bench_targets.sh) gives the table of each
// target against the baseline:
//   kernel/gemv_f32      y = W x, W f32 [4096, 4096] (64 MB, streamed from memory): GB/s, GFLOP/s
//   kernel/gemv_bf16     the same W held bf16 (32 MB), widened in registers
//   kernel/mxfp4_linear  y = W x, W MXFP4 [2048, 4096] (4.25 MB, cache-warm), 1 and 4 rows of x:
//                        G weights/s (decode of an expert is compute-bound, not memory-bound)
//   kernel/situ          SiTU forward over 1M values: G values/s
//   kernel/mm_f32        the KDA tile product 64 x 64 x 128 (L1-resident): GFLOP/s
//   machine/fma_peak     the dispatched target's FMA peak, one thread (the ceiling of mm_f32)
// The first line names the CPU and the target (bench/machine_peak.h).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/simd_target.h"
#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "kernels/machine_probe.h"
#include "kernels/matmul_bf16.h"
#include "kernels/mxfp4_linear.h"
#include "kernels/situ_simd.h"
#include "machine_peak.h"

using namespace k3;

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  return v;
}

void BM_GemvF32(benchmark::State& st) {
  const int64_t N = 4096, K = 4096;
  const std::vector<float> W = random_floats(N * K, 1), x = random_floats(K, 2);
  std::vector<float> y(N);
  for (auto _ : st) {
    gemm_few_rows(false, true, 1, N, K, 1.f, x.data(), K, W.data(), K, 0.f, y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GB/s"] = benchmark::Counter(4.0 * N * K, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * N * K, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name + " x" + std::to_string(dispatched_f32_lanes()));
}

void BM_GemvBf16(benchmark::State& st) {
  const int64_t N = 4096, K = 4096;
  const std::vector<float> Wf = random_floats(N * K, 1), x = random_floats(K, 2);
  std::vector<uint16_t> W(Wf.size());
  for (size_t i = 0; i < W.size(); ++i) W[i] = f32_to_bf16(Wf[i]);
  std::vector<float> y(N);
  for (auto _ : st) {
    gemm_few_rows_bf16(false, true, 1, N, K, 1.f, x.data(), K, W.data(), K, 0.f, y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GB/s"] = benchmark::Counter(2.0 * N * K, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * N * K, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name + " x" + std::to_string(dispatched_f32_lanes()));
}

void BM_Mxfp4Linear(benchmark::State& st) {
  const int64_t out = 2048, in = 4096, rows = st.range(0);
  Tensor Wf = Tensor::empty(DType::F32, {out, in});
  const std::vector<float> r = random_floats(out * in, 3);
  std::copy(r.begin(), r.end(), Wf.data<float>());
  const Mxfp4Matrix W = Mxfp4Matrix::quantize(Wf);
  const std::vector<float> x = random_floats(rows * in, 4);
  std::vector<float> y(size_t(rows * out));
  for (auto _ : st) {
    mxfp4_linear(y.data(), x.data(), W.packed.data<uint8_t>(), W.scales.data<uint8_t>(), rows, in, out, out);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["Gweights/s"] = benchmark::Counter(double(out * in), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GB/s"] = benchmark::Counter(double(out * in) * 17 / 32, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name + " x" + std::to_string(dispatched_f32_lanes()));
}

void BM_Situ(benchmark::State& st) {
  const int64_t n = 1 << 20;
  const std::vector<float> g = random_floats(n, 5), u = random_floats(n, 6);
  std::vector<float> o(static_cast<size_t>(n));
  for (auto _ : st) {
    situ_forward_fast(o.data(), g.data(), u.data(), n, 4.0, 25.0);
    benchmark::DoNotOptimize(o.data());
  }
  st.counters["Gvalues/s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name + " x" + std::to_string(dispatched_f32_lanes()));
}

void BM_MmF32(benchmark::State& st) {
  const int64_t M = 64, N = 64, K = 128;
  const std::vector<float> A = random_floats(M * K, 7), B = random_floats(K * N, 8);
  std::vector<float> C(size_t(M * N));
  for (auto _ : st) {
    mm_f32(C.data(), N, A.data(), K, false, B.data(), N, M, N, K, 1.f, false);
    benchmark::DoNotOptimize(C.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name + " x" + std::to_string(dispatched_f32_lanes()));
}

void BM_FmaOneThread(benchmark::State& st) {
  double flops = 0;
  for (auto _ : st) {
    float sink;
    flops = fma_peak_loop(1 << 22, &sink);
    benchmark::DoNotOptimize(sink);
  }
  st.counters["GFLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name + " x" + std::to_string(dispatched_f32_lanes()));
}

}  // namespace

int main(int argc, char** argv) {
  set_num_threads(1);  // one core: per-target kernel speed, not thread scaling
  benchmark::RegisterBenchmark("kernel/gemv_f32", BM_GemvF32)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/gemv_bf16", BM_GemvBf16)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/mxfp4_linear", BM_Mxfp4Linear)->Arg(1)->Arg(4)->ArgName("rows")->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/situ", BM_Situ)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/mm_f32", BM_MmF32)->UseRealTime();
  benchmark::RegisterBenchmark("machine/fma_peak_1thread", BM_FmaOneThread)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
