// The CUDA backend on whole models (issue 31's speed goals; docs/benchmarks.md, CUDA section),
// each figure against the ceilings measured in the same run (cuda/probe.h):
//   Peaks              copy GB/s (read + written) and cuBLAS bf16 TFLOP/s
//   SliceDecode        one sequence on a K3-width slice (configs/k3-slice.json: d 7168, the real
//                      KDA, MLA and 896-expert MoE shapes, bf16 dense, MXFP4 experts; random
//                      weights built in memory): tok/s and its share of the memory bound (the
//                      bytes a decode step must read, as stored, over the copy bandwidth)
//   SlicePrefill/8192  the same model: tok/s and matrix TFLOP/s against the bf16 peak
//   ServeAggregate/N   mid-1024 (random weights) in the serving engine, N concurrent requests
//   MidPrefill         mid-1024, 4 sequences of 2048 tokens (K3_MID_DIR: a checkpoint to load,
//                      the one tools/k3_torch_prefill_bench.py reads, else random weights)
// Every benchmark skips with the reason without a GPU.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "infer/engine.h"
#include "io/config.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "model/k3_model.h"
#include "model/planner.h"
#ifdef K3_HAVE_CUDA
#include "cuda/cuda_device.h"
#include "cuda/cuda_ops.h"
#include "cuda/probe.h"
#endif

using namespace k3;

namespace {

#ifdef K3_HAVE_CUDA

std::shared_ptr<const Ops> gpu() {
  static std::shared_ptr<const Ops> ops = cuda::cuda_available() ? cuda::make_cuda_ops(0) : nullptr;
  return ops;
}

struct Peaks {
  double copy_gbps = 0, bf16_tflops = 0;
};
const Peaks& peaks() {
  static const Peaks p = [] {
    cuda::CudaDevice& dev = *cuda::cuda_device_of(*gpu());
    return Peaks{cuda::measure_copy_gbps(dev), cuda::measure_bf16_tflops(dev)};
  }();
  return p;
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Random weights as the release holds them (bf16 dense matrices, MXFP4 routed experts, f32
// vectors from the init recipe), drawn with a counter hash in parallel: a K3-width slice is
// 34 GB, which the init recipe's normal draws would take minutes to fill.
K3Model random_release_model(const K3Config& c) {
  const ParamLayout probe(c, ExpertStorage::Mxfp4);
  std::vector<bool> bf16(probe.size());
  for (size_t i = 0; i < probe.size(); ++i) {
    const ParamSpec& s = probe.spec(i);
    bf16[i] = s.shape.size() == 2 && s.shape[0] >= 2 && s.shape[1] >= 2 && s.component != Component::RoutedExperts;
  }
  WeightStore w(c, ExpertStorage::Mxfp4, bf16);
  const ParamLayout& lay = w.layout();
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& s = lay.spec(i);
    if (lay.in_buffer(i)) {
      init_tensor(w.param(i), s.numel(), s, init_rule(s), 1, 0.02, c.num_hidden_layers);
    } else if (lay.bf16_held(i)) {
      Tensor t = Tensor::empty(DType::BF16, s.shape);
      uint16_t* p = t.data<uint16_t>();
      const int64_t n = s.numel();
      const double scale = 0.035 / std::sqrt(double(s.shape[1]) / 1024.0);  // about std 0.02 at d 1024
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < n; ++j) {
        const uint64_t h = mix(uint64_t(j) * 0x9e3779b97f4a7c15ull + i);
        p[j] = f32_to_bf16(float((double(h >> 11) * (1.0 / 9007199254740992.0) * 2 - 1) * scale));
      }
      w.set_bf16(i, std::move(t));
    } else {
      const int64_t rows = s.shape[0], cols = s.shape[1];
      Tensor pk = Tensor::empty(DType::U8, {rows, cols / 2}), sc = Tensor::empty(DType::U8, {rows, cols / 32});
      uint8_t* p = pk.data<uint8_t>();
      uint8_t* q = sc.data<uint8_t>();
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < rows * cols / 2; ++j) p[j] = uint8_t(mix(uint64_t(j) + (uint64_t(i) << 40)));
      for (int64_t j = 0; j < rows * cols / 32; ++j) q[j] = uint8_t(118 + j % 4);  // values about 2^-9 .. 6 2^-6
      w.set_mxfp4(i, Mxfp4Matrix::from(std::move(pk), std::move(sc), s.name));
    }
  }
  K3Model m(std::move(w));
  m.to_backend(gpu());
  return m;
}

K3Config slice_config() { return load_config(std::string(K3_SOURCE_DIR) + "/configs/k3-slice.json"); }

// Bytes a decode step must move, as stored: every dense matrix once, the k routed experts of
// each MoE layer, one embedding row, the lm_head, each KDA state read and written, the MLA
// cache read (ctx tokens).
double decode_bytes(const K3Model& m, int64_t ctx) {
  const K3Config& c = m.config();
  const ParamLayout& lay = m.weights().layout();
  double b = 0;
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& s = lay.spec(i);
    if (s.component == Component::RoutedExperts) continue;
    if (s.component == Component::Embedding) {
      b += 2.0 * double(s.shape[1]);
      continue;
    }
    b += double(s.numel()) * (lay.bf16_held(i) ? 2.0 : 4.0);
  }
  const double expert = 3.0 * double(c.routed_expert_hidden_size) * double(c.moe_intermediate_size) * 17.0 / 32.0;
  int64_t moe = 0, kda = 0, mla = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    moe += c.is_moe_layer(l);
    (c.is_mla_layer(l) ? mla : kda) += 1;
  }
  b += double(moe * c.num_experts_per_token) * expert;
  b += double(kda) * 2.0 * 4.0 * double(c.kda_num_heads * c.kda_head_dim * c.kda_head_dim);
  b += double(mla) * 4.0 * double(ctx) * double(c.kv_lora_rank + c.qk_rope_head_dim);
  return b;
}

#define K3_REQUIRE_GPU(state)                                      \
  if (!gpu()) {                                                    \
    state.SkipWithError(("no GPU: " + cuda::describe_cuda()).c_str()); \
    return;                                                        \
  }

void BM_Peaks(benchmark::State& state) {
  K3_REQUIRE_GPU(state);
  for (auto _ : state) benchmark::DoNotOptimize(peaks());
  state.counters["copy_GBps"] = peaks().copy_gbps;
  state.counters["bf16_TFLOPs"] = peaks().bf16_tflops;
}
BENCHMARK(BM_Peaks)->Iterations(1)->Unit(benchmark::kMillisecond);

const K3Model& slice_model() {
  static const K3Model m = random_release_model(slice_config());
  return m;
}

int32_t argmax(const std::vector<float>& l) { return int32_t(std::max_element(l.begin(), l.end()) - l.begin()); }

void BM_SliceDecode(benchmark::State& state) {
  K3_REQUIRE_GPU(state);
  const K3Model& m = slice_model();
  const int64_t V = m.dims().V, prompt = 64;
  DecodeState st = m.new_state();
  ForwardScratch s;
  std::vector<int32_t> ids(prompt);
  for (int64_t i = 0; i < prompt; ++i) ids[size_t(i)] = int32_t(mix(uint64_t(i)) % uint64_t(V));
  std::vector<float> l(static_cast<size_t>(V));
  ForwardOptions pf;
  pf.last_only = true;
  m.forward(l.data(), ids.data(), prompt, st, s, pf);
  ForwardOptions dc;
  dc.mode = MixerMode::Decode;
  dc.last_only = true;
  int32_t next = argmax(l);
  for (int w = 0; w < 3; ++w) m.forward(l.data(), &next, 1, st, s, dc), next = argmax(l);  // warm-up
  int64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    m.forward(l.data(), &next, 1, st, s, dc);
    next = argmax(l);
    ++n;
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double bytes = decode_bytes(m, prompt + 3 + n / 2);
  const double bound = peaks().copy_gbps * 1e9 / bytes;  // tokens/s at the copy bandwidth
  state.counters["tok_per_s"] = double(n) / sec;
  state.counters["bytes_per_token_GB"] = bytes * 1e-9;
  state.counters["bound_tok_per_s"] = bound;
  state.counters["pct_of_bound"] = 100.0 * double(n) / sec / bound;
}
BENCHMARK(BM_SliceDecode)->Iterations(32)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SlicePrefill(benchmark::State& state) {
  K3_REQUIRE_GPU(state);
  const K3Model& m = slice_model();
  const int64_t T = state.range(0), V = m.dims().V;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) ids[size_t(i)] = int32_t(mix(uint64_t(i) + 99) % uint64_t(V));
  std::vector<float> l(static_cast<size_t>(V));
  ForwardScratch s;
  ForwardOptions pf;
  pf.last_only = true;
  {
    DecodeState st = m.new_state();  // warm-up: workspaces, cuBLAS's choices
    m.forward(l.data(), ids.data(), T, st, s, pf);
  }
  int64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    DecodeState st = m.new_state();
    m.forward(l.data(), ids.data(), T, st, s, pf);
    ++n;
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(n);
  const double flops = forward_flops_per_token(m.config(), T).matmul * double(T);
  state.counters["tok_per_s"] = double(T) / sec;
  state.counters["matmul_TFLOPs"] = flops / sec * 1e-12;
  state.counters["pct_of_bf16_peak"] = 100.0 * flops / sec * 1e-12 / peaks().bf16_tflops;
}
BENCHMARK(BM_SlicePrefill)->Arg(8192)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();

const K3Model& mid_model() {
  static const K3Model m = [] {
    if (const char* dir = std::getenv("K3_MID_DIR"); dir && *dir) {
      LoadOptions lo;
      lo.dense_as_stored = true;
      lo.backend = gpu();
      return load_model(dir, lo);
    }
    return random_release_model(load_config(std::string(K3_SOURCE_DIR) + "/configs/mid-1024.json"));
  }();
  return m;
}

void BM_MidPrefill(benchmark::State& state) {
  K3_REQUIRE_GPU(state);
  const K3Model& m = mid_model();
  const int64_t B = 4, T = 2048, V = m.dims().V;
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) ids[size_t(i)] = int32_t(mix(uint64_t(i) + 7) % uint64_t(V));
  std::vector<float> l(static_cast<size_t>(V));
  ForwardScratch s;
  ForwardOptions pf;
  pf.last_only = true;
  for (auto _ : state)
    for (int64_t b = 0; b < B; ++b) {
      DecodeState st = m.new_state();
      m.forward(l.data(), ids.data() + b * T, T, st, s, pf);
    }
  state.counters["tok_per_s"] = benchmark::Counter(double(B * T), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MidPrefill)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

// N concurrent requests of 32 prompt and 64 generated tokens in the engine; aggregate tok/s.
void BM_ServeAggregate(benchmark::State& state) {
  K3_REQUIRE_GPU(state);
  const K3Model& m = mid_model();
  const int64_t N = state.range(0), V = m.dims().V;
  EngineOptions o;
  o.parallel = N;
  o.ctx = 256;
  o.prefix_cache = false;
  Engine e(m, o);
  int64_t generated = 0;
  for (auto _ : state) {
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int64_t r = 0; r < N; ++r) {
      GenerationRequest q;
      for (int64_t i = 0; i < 32; ++i) q.prompt.push_back(int32_t(mix(uint64_t(r * 100 + i)) % uint64_t(V)));
      q.max_tokens = 64;
      hs.push_back(e.submit(std::move(q)));
    }
    for (auto& h : hs) {
      GenerationEvent ev;
      while (h->next(ev, std::chrono::seconds(120)) && !ev.final) ++generated;
    }
  }
  state.counters["tok_per_s"] = benchmark::Counter(double(generated), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ServeAggregate)->Arg(1)->Arg(64)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

#else

void BM_NoCudaBackend(benchmark::State& state) { state.SkipWithError("this build has no CUDA backend"); }
BENCHMARK(BM_NoCudaBackend);

#endif

}  // namespace
