// Kernel benchmark on the dispatched SIMD target (docs/benchmarks.md, "SIMD targets"): the hot
// inference kernels one at a time, single thread, on decode-sized shapes, so one run per target
// (K3_SIMD_TARGET=avx2|sse4|scalar ..., scripts/bench_targets.sh) gives the table of each
// target against the baseline:
//   kernel/gemv_f32      y = W x, W f32 [4096, 4096] (64 MB, streamed from memory): GB/s, GFLOP/s
//   kernel/gemv_bf16     the same W held bf16 (32 MB), widened in registers
//   kernel/gemm_rows_bf16 Y = X W^T, W bf16 [16384, 1024] (32 MB, from memory), X 8 rows: the
//                        dense products of a decode step of 8 sequences (compute-bound): GFLOP/s
//   kernel/mxfp4_linear  y = W x, W MXFP4 [2048, 4096] (4.25 MB, cache-warm), 1 and 4 rows of x:
//                        G weights/s (decode of an expert is compute-bound, not memory-bound)
//   kernel/moe_decode    the routed experts of one decode step (kernels/moe.h), mid-1024 shapes:
//                        896 MXFP4 experts [256, 512] / [512, 256] (187 MB: from memory, as in
//                        decode), T tokens x top-16 fresh random routing per iteration:
//                        G weight-rows/s (weights x rows multiplied) and GFLOP/s
//   kernel/situ          SiTU forward over 1M values: G values/s
//   kernel/mm_f32        the KDA tile product 64 x 64 x 128 (L1-resident): GFLOP/s
//   machine/fma_peak     the dispatched target's FMA peak, one thread (the ceiling of mm_f32)
// The first line names the CPU and the target (bench/machine_peak.h).
#include <benchmark/benchmark.h>

#include <algorithm>
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
#include "kernels/moe.h"
#include "kernels/mxfp4_linear.h"
#include "kernels/situ_simd.h"
#include "kernels/small_matmul.h"
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

void BM_GemmRowsBf16(benchmark::State& st) {
  const int64_t M = st.range(0), N = 16384, K = 1024;
  const std::vector<float> Wf = random_floats(N * K, 1), x = random_floats(M * K, 2);
  std::vector<uint16_t> W(Wf.size());
  for (size_t i = 0; i < W.size(); ++i) W[i] = f32_to_bf16(Wf[i]);
  std::vector<float> y(size_t(M * N));
  for (auto _ : st) {
    gemm_few_rows_bf16(false, true, M, N, K, 1.f, x.data(), K, W.data(), K, 0.f, y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate);
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

void BM_Mxfp4Dequantize(benchmark::State& st) {
  const int64_t out = 64, in = 4096;  // 1 MB of f32 out: L2-resident
  Tensor Wf = Tensor::empty(DType::F32, {out, in});
  const std::vector<float> r = random_floats(out * in, 11);
  std::copy(r.begin(), r.end(), Wf.data<float>());
  const Mxfp4Matrix W = Mxfp4Matrix::quantize(Wf);
  std::vector<float> dst(size_t(out * in));
  for (auto _ : st) {
    mxfp4_dequantize(dst.data(), W.packed.data<uint8_t>(), W.scales.data<uint8_t>(), out, in);
    benchmark::DoNotOptimize(dst.data());
  }
  st.counters["Gweights/s"] = benchmark::Counter(double(out * in), benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(simd_target().name + " x" + std::to_string(dispatched_f32_lanes()));
}

// The routed-expert part of a decode step of T sequences (mid-1024: latent 512, expert width
// 256, 896 experts, top-16): weights random bytes (scales 2^-8 .. 2^-1), so every matrix is
// read from memory as in the engine; each iteration routes the T tokens afresh.
void BM_MoeDecode(benchmark::State& st) {
  const int64_t T = st.range(0), E = st.range(1), k = 16, n_in = 512, F = 256;
  std::mt19937 rng(12);
  auto random_mx = [&](int64_t rows, int64_t cols) {
    Tensor p = Tensor::empty(DType::U8, {rows, cols / 2}), s = Tensor::empty(DType::U8, {rows, cols / 32});
    for (int64_t i = 0; i < rows * cols / 2; ++i) p.data<uint8_t>()[i] = uint8_t(rng());
    for (int64_t i = 0; i < rows * cols / 32; ++i) s.data<uint8_t>()[i] = uint8_t(119 + rng() % 8);
    return Mxfp4Matrix::from(p, s, "bench");
  };
  static std::vector<Mxfp4Matrix> mats;  // built once for every T
  if (int64_t(mats.size()) < 3 * E)
    for (int64_t e = int64_t(mats.size()) / 3; e < E; ++e) {
      mats.push_back(random_mx(F, n_in));
      mats.push_back(random_mx(F, n_in));
      mats.push_back(random_mx(n_in, F));
    }
  std::vector<ExpertMatrix> w1(E), w3(E), w2(E);
  for (int64_t e = 0; e < E; ++e) {
    w1[e] = {nullptr, &mats[3 * e], F, n_in};
    w3[e] = {nullptr, &mats[3 * e + 1], F, n_in};
    w2[e] = {nullptr, &mats[3 * e + 2], n_in, F};
  }
  const std::vector<float> z = random_floats(T * n_in, 13);
  std::vector<float> u(size_t(T * n_in)), wts(size_t(T * k), 1.f / float(k));
  std::vector<int32_t> idx(size_t(T * k));
  MoEExpertScratch scratch;
  for (auto _ : st) {
    st.PauseTiming();
    for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token
      std::vector<int32_t> pick;
      while (int64_t(pick.size()) < k) {
        const int32_t e = int32_t(rng() % uint32_t(E));
        if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
      }
      std::copy(pick.begin(), pick.end(), idx.begin() + t * k);
    }
    st.ResumeTiming();
    moe_experts_forward(u.data(), z.data(), idx.data(), wts.data(), w1.data(), w3.data(), w2.data(), T, n_in, F, E, k,
                        4.0, 25.0, scratch);
    benchmark::DoNotOptimize(u.data());
  }
  const double wr = double(T * k * 3 * F * n_in);  // weight-rows multiplied
  st.counters["Gweight-rows/s"] = benchmark::Counter(wr, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GFLOP/s"] = benchmark::Counter(2 * wr, benchmark::Counter::kIsIterationInvariantRate);
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

// A routed expert at prefill (kernels/moe.cpp): n gathered tokens as columns through
// linear_cols_mxfp4 ([out, in] MXFP4, rows dequantised block by block inside the product).
void BM_ExpertPrefill(benchmark::State& st) {
  const int64_t n = st.range(0), in = 512, out = 256, ld = (n + 15) / 16 * 16;
  Tensor Wf = Tensor::empty(DType::F32, {out, in});
  const std::vector<float> r = random_floats(out * in, 9);
  std::copy(r.begin(), r.end(), Wf.data<float>());
  const Mxfp4Matrix W = Mxfp4Matrix::quantize(Wf);
  const std::vector<float> xt = random_floats(in * ld, 10);
  std::vector<float> yt(size_t(out * ld));
  for (auto _ : st) {
    linear_cols_mxfp4(yt.data(), xt.data(), W.packed.data<uint8_t>(), W.scales.data<uint8_t>(), n, in, out, ld, ld);
    benchmark::DoNotOptimize(yt.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * in * out, benchmark::Counter::kIsIterationInvariantRate);
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
  benchmark::RegisterBenchmark("kernel/gemm_rows_bf16", BM_GemmRowsBf16)->Arg(8)->ArgName("M")->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/mxfp4_linear", BM_Mxfp4Linear)->Arg(1)->Arg(4)->ArgName("rows")->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/expert_prefill", BM_ExpertPrefill)->Arg(37)->Arg(16)->ArgName("n")->UseRealTime();
  benchmark::RegisterBenchmark("kernel/mxfp4_dequantize", BM_Mxfp4Dequantize)->UseRealTime();
  benchmark::RegisterBenchmark("kernel/moe_decode", BM_MoeDecode)->Args({1, 896})->Args({8, 896})->Args({1, 16})->ArgNames({"T", "E"})->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/situ", BM_Situ)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("kernel/mm_f32", BM_MmF32)->UseRealTime();
  benchmark::RegisterBenchmark("machine/fma_peak_1thread", BM_FmaOneThread)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
