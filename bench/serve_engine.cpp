// Serving-engine benchmark (docs/serving.md, "Engine"): the mid-1024 model (MXFP4 routed
// experts, bf16 dense, bench/bench_model.h) behind infer/engine.h, 2 threads. In run order:
//   engine/decode/B    B requests submitted together (B = 1, 2, 4, 8, 16), prompts of 64 tokens,
//                      64 tokens generated each (greedy). agg_tok/s = tokens produced by decode
//                      steps / seconds inside the batched decode steps (engine stats), so the
//                      prefills do not count; seq_tok/s = agg_tok/s / B; speedup_vs_1 against
//                      engine/decode/1 of the same run.
//   engine/ttft/...    a 2048-token shared prefix plus a 16-token question, one request at a
//                      time: `uncached` with the prefix cache off, `cached` after the engine has
//                      served the same prefix with another question (its snapshots are cached);
//                      ttft_ms is submit to first token; the summary gives the ratio.
//   engine/overhead/16 16 concurrent requests: the share of the scheduler loop's time spent
//                      outside the model (admission, sampling, bookkeeping) against the step.
//   machine/*          this run's peaks (bench/machine_peak.h): streaming read, FMA and bf16-dot.
// The summary adds the roofline of a decode step of B sequences from those peaks: bytes read
// (the dense weights once, the distinct routed experts (measured from the model's routing of
// the decode prompts; the uniform expectation beside it), each sequence's KDA state read and
// written) over the read bandwidth, against FLOPs (planner, B tokens) over the FMA peak; the
// larger is the step's lower bound, and 8 x bound(1) / bound(8) the most batching can give.
// Own flags: --model_dir=DIR, --model_config=FILE, --threads=N (default 2).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_model.h"
#include "bench_results.h"
#include "core/simd_target.h"
#include "core/threads.h"
#include "infer/engine.h"
#include "machine_peak.h"
#include "model/checkpoint.h"
#include "model/planner.h"

using namespace k3;
using namespace std::chrono_literals;

namespace {

std::string g_model_dir, g_model_config;
int g_threads = 2;

const K3Model& model() {
  static std::unique_ptr<K3Model> m;
  if (!m) {
    LoadOptions lo;
    lo.dense_as_stored = true;  // as `k3cpp serve` loads
    m = std::make_unique<K3Model>(load_model(bench::bench_model_dir(g_model_dir, g_model_config), lo));
  }
  return *m;
}

std::vector<int32_t> tokens(int64_t n, int64_t V, uint64_t seed) { return bench::bench_tokens(n, V, seed); }

// Waits for the final event of h; returns its TTFT (seconds).
double run_to_end(RequestHandle& h) {
  GenerationEvent ev;
  double ttft = 0;
  while (h.next(ev, 600s)) {
    if (ev.ttft_s > 0) ttft = ev.ttft_s;
    if (ev.final) {
      if (ev.finish != "length") std::fprintf(stderr, "request ended with %s %s\n", ev.finish.c_str(), ev.error.c_str());
      break;
    }
  }
  return ttft;
}

GenerationRequest request(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest q;
  q.prompt = std::move(prompt);
  q.max_tokens = n;
  return q;
}

// B requests of `prompt` tokens, G tokens generated each, submitted together to an engine
// with B slots; the engine's stats after the last one ends.
EngineStats run_batch(benchmark::State& state, int64_t B, int64_t prompt, int64_t G, uint64_t seed0) {
  const K3Model& m = model();
  EngineOptions o;
  o.parallel = B;
  o.ctx = 1024;
  EngineStats st;
  for (auto _ : state) {
    Engine e(m, o);
    std::vector<std::shared_ptr<RequestHandle>> hs;
    for (int64_t j = 0; j < B; ++j)
      hs.push_back(e.submit(request(tokens(prompt, m.dims().V, seed0 + uint64_t(j)), G)));
    for (auto& h : hs) run_to_end(*h);
    st = e.stats();
  }
  return st;
}

void BM_Decode(benchmark::State& state, int64_t B) {
  const int64_t G = 64;
  const EngineStats st = run_batch(state, B, 64, G, 1);
  // Every token but each request's first comes out of a batched decode step.
  const double agg = double(B * (G - 1)) / st.step_seconds;
  state.counters["agg_tok/s"] = agg;
  state.counters["seq_tok/s"] = agg / double(B);
  state.counters["steps"] = double(st.steps);
  // With --threads=1 the scheduler thread does all the compute: its CPU time is the work.
  state.counters["agg_tok/cpu_s"] = double(B * (G - 1)) / st.step_cpu_seconds;
  const auto& r = bench::results();
  const auto one = r.find("engine/decode/1");
  if (one != r.end() && B > 1) state.counters["speedup_vs_1"] = agg / one->second.c.at("agg_tok/s");
}

void BM_Ttft(benchmark::State& state, bool cached) {
  const K3Model& m = model();
  const int64_t V = m.dims().V;
  const std::vector<int32_t> prefix = tokens(2048, V, 77);
  auto with_question = [&](uint64_t seed) {
    std::vector<int32_t> p = prefix;
    const std::vector<int32_t> q = tokens(16, V, seed);
    p.insert(p.end(), q.begin(), q.end());
    return p;
  };
  EngineOptions o;
  o.parallel = 1;
  o.ctx = 4096;
  o.prefix_cache = cached;
  double ttft = 0;
  int64_t cached_tokens = 0;
  for (auto _ : state) {
    Engine e(m, o);
    run_to_end(*e.submit(request(with_question(1), 1)));  // warms the cache (or, uncached, the kernels)
    auto h = e.submit(request(with_question(2), 1));
    ttft = run_to_end(*h);
    cached_tokens = int64_t(e.stats().cached_prompt_tokens_total);
  }
  state.counters["ttft_ms"] = ttft * 1e3;
  state.counters["cached_tokens"] = double(cached_tokens);
}

void BM_Overhead(benchmark::State& state) {
  const EngineStats st = run_batch(state, 16, 32, 48, 100);
  const double total = st.step_seconds + st.prefill_seconds + st.schedule_seconds;
  state.counters["schedule_share"] = st.schedule_seconds / total;
  state.counters["schedule_ms_per_step"] = 1e3 * st.schedule_seconds / double(st.steps);
  state.counters["step_ms"] = 1e3 * st.step_seconds / double(st.steps);
}

// Distinct routed experts per MoE layer when B sequences decode at the same position: 16
// prompts of 64 tokens (the decode runs' prompts) through the model with a record of their
// routing; at each position p the union over sequences [j, j + B) of their top-k, averaged
// over positions, layers and the 16 / B groups. Measured, since a skewed router shares more
// experts than the uniform E (1 - (1 - k/E)^B).
double measured_distinct(const K3Model& m, int64_t B) {
  static std::vector<ForwardRecord> recs;  // one per prompt, computed once
  const int64_t n_seq = 16, T = 64;
  if (recs.empty())
    for (int64_t j = 0; j < n_seq; ++j) {
      const std::vector<int32_t> ids = tokens(T, m.dims().V, 1 + uint64_t(j));
      std::vector<float> logits(size_t(T * m.dims().V));
      DecodeState st = m.new_state();
      ForwardScratch s;
      recs.emplace_back();
      m.forward(logits.data(), ids.data(), T, st, s, {}, &recs.back());
    }
  const K3Config& c = m.config();
  const int64_t k = c.num_experts_per_token;
  double sum = 0;
  int64_t n = 0;
  std::vector<char> seen(size_t(c.num_experts));
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (!c.is_moe_layer(layer)) continue;
    for (int64_t j0 = 0; j0 + B <= n_seq; j0 += B)
      for (int64_t p = 0; p < T; ++p) {
        std::fill(seen.begin(), seen.end(), 0);
        int64_t distinct = 0;
        for (int64_t j = j0; j < j0 + B; ++j)
          for (int64_t r = 0; r < k; ++r) {
            const int32_t e = recs[size_t(j)].layers[size_t(layer)].moe.routing.idx[size_t(p * k + r)];
            distinct += !seen[size_t(e)];
            seen[size_t(e)] = 1;
          }
        sum += double(distinct);
        ++n;
      }
  }
  return sum / double(n);
}

// The roofline of one decode step of B sequences (see the header), with `distinct` routed
// experts read per MoE layer.
struct StepBound {
  double bytes = 0, flops = 0, distinct = 0;
  double seconds(double bw, double peak) const { return std::max(bytes / bw, flops / peak); }
};
StepBound step_bound(const K3Config& c, int64_t B, int64_t context, double distinct) {
  const WeightBytes wb = weight_bytes(c, WeightStorage::MXFP4);
  const CacheBytes cb = decode_cache_bytes(c, context);
  const double E = double(c.num_experts);
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) moe_layers += c.is_moe_layer(i);
  StepBound s;
  s.distinct = distinct;
  const double per_expert = double(wb.routed_experts) / (E * double(moe_layers));
  const double embedding = 2.0 * double(count_params(c).of(Component::Embedding).total);  // bf16, B rows read
  s.bytes = double(wb.other) - embedding + s.distinct * per_expert * double(moe_layers) +
            double(B) * (2.0 * double(cb.kda_total) + double(cb.mla_total));
  s.flops = double(B) * forward_flops_per_token(c, context).total();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  bench::take_own_flags(argc, argv, [](const std::string&, auto val) {
    if (const char* v = val("--model_dir=")) return g_model_dir = v, true;
    if (const char* v = val("--model_config=")) return g_model_config = v, true;
    if (const char* v = val("--threads=")) return g_threads = std::stoi(v), true;
    return false;
  });
  set_num_threads(g_threads);
  for (int64_t B : {1, 2, 4, 8, 16})
    benchmark::RegisterBenchmark(("engine/decode/" + std::to_string(B)).c_str(), BM_Decode, B)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("engine/ttft/uncached", BM_Ttft, false)->Iterations(1)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("engine/ttft/cached", BM_Ttft, true)->Iterations(1)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("engine/overhead/16", BM_Overhead)->Iterations(1)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("machine/mem_read", bench::BM_MachineMemRead)->Iterations(5)->UseRealTime();
  benchmark::RegisterBenchmark("machine/fma_peak", bench::BM_MachineFma)->Arg(0)->Arg(1)->ArgName("bf16")->UseRealTime();
  benchmark::Initialize(&argc, argv);
  bench::Capture rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  const auto& r = bench::results();
  auto c = [&](const char* name, const char* key) {
    const auto it = r.find(name);
    return it == r.end() || !it->second.c.count(key) ? NAN : it->second.c.at(key);
  };
  std::printf("\nsummary (%s, %d threads):\n", machine_summary().c_str(), g_threads);
  std::printf("  decode 8 sequences / 1 sequence, aggregate tok/s: %.2fx (target >= 4x)\n",
              c("engine/decode/8", "agg_tok/s") / c("engine/decode/1", "agg_tok/s"));
  std::printf("  TTFT with a cached 2K prefix: %.1f ms vs %.1f ms uncached: %.1fx (target >= 10x)\n",
              c("engine/ttft/cached", "ttft_ms"), c("engine/ttft/uncached", "ttft_ms"),
              c("engine/ttft/uncached", "ttft_ms") / c("engine/ttft/cached", "ttft_ms"));
  std::printf("  scheduler share of loop time at 16 concurrent: %.2f%% (target < 5%%)\n",
              100 * c("engine/overhead/16", "schedule_share"));
  // The roofline (contexts: the decode runs' 64-token prompts plus up to 64 generated).
  const double bw = c("machine/mem_read", "best_B/s"), fma = c("machine/fma_peak/bf16:0", "FLOP/s"),
               dot = c("machine/fma_peak/bf16:1", "FLOP/s");
  const K3Config& cfg = model().config();
  std::printf("  roofline of a decode step (read %.1f GB/s best pass, f32 FMA %.1f GFLOP/s, bf16 dot %.1f GFLOP/s):\n",
              bw / 1e9, fma / 1e9, dot / 1e9);
  std::printf("    %3s %9s %9s %9s %10s %12s %12s %14s %9s\n", "B", "experts", "uniform", "MB read", "GFLOP",
              "bound f32 ms", "bound bf16 ms", "measured ms", "of bound");
  double bound[2][17] = {};  // [f32 FMA, bf16 dot][B]
  for (int64_t B : {1, 2, 4, 8, 16}) {
    const double E = double(cfg.num_experts), k = double(cfg.num_experts_per_token);
    const double uniform = E * (1 - std::pow(1 - k / E, double(B)));
    const StepBound sb = step_bound(cfg, B, 96, measured_distinct(model(), B));
    bound[0][B] = sb.seconds(bw, fma);
    bound[1][B] = sb.seconds(bw, std::max(fma, dot));
    const double measured = double(B) / c(("engine/decode/" + std::to_string(B)).c_str(), "agg_tok/s");
    if (std::isnan(measured)) continue;  // that B was filtered out of this run
    std::printf("    %3lld %9.1f %9.1f %9.1f %10.3f %12.2f %12.2f %14.2f %8.0f%%\n", (long long)B, sb.distinct, uniform,
                sb.bytes / 1e6,
                sb.flops / 1e9, 1e3 * bound[0][B], 1e3 * bound[1][B], 1e3 * measured, 100 * bound[0][B] / measured);
  }
  std::printf("  at the roofline, 8 sequences / 1 sequence: %.2fx with the f32 FMA peak, %.2fx with every FLOP at the "
              "bf16-dot peak (target >= 4x)\n",
              8 * bound[0][1] / bound[0][8], 8 * bound[1][1] / bound[1][8]);
  return 0;
}
