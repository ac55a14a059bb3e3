// Training-step benchmark (docs/benchmarks.md, section "Training: model FLOPs utilisation"):
// optimiser steps of a run file through Trainer::step, exactly what `k3cpp train` runs
// (micro-batches of sequences in parallel, forward + backward, gradient reduction, clipping,
// per-head Muon / AdamW, the balancer), without evaluation or checkpoints. In run order:
//   machine/sgemm_openblas/2048  the f32 matrix-multiply peak of this run (bench/machine_peak.h);
//   train/step                   one optimiser step per iteration, after --warmup steps that
//                                are not timed (the first step touches every gradient and
//                                optimiser page).
// Counters of train/step: tok/s; model_GFLOP/s = tok/s x 3 x forward FLOPs per token
// (model/planner.h forward_flops_per_token at the stage's sequence length: 2 x active matrix
// parameters, short conv, MLA attention over the causal average context, KDA state update in
// its recurrent form; backward = 2 x forward); MFU = model_GFLOP/s / the sgemm peak of the run
// (issue 4 target: >= 30 %); fwd_bwd and update: the fractions of the step spent in forward +
// backward and in clipping + optimiser + balancer; maxvio: the largest per-layer MaxVio of the
// timed steps' routing (a collapsed router routes every token to a few experts, which makes
// the grouped expert products large and the step faster: this figure says whether it did).
// Own flags (removed before Google Benchmark sees argv): --run=FILE (default
// bench/training/mid-512.json), --threads=N (default 2), --warmup=N (default 2), --steps=N
// (timed, default 4), --out=DIR (scratch output; default <build dir>/bench-train-out, removed
// at the start).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "bench_results.h"
#include "core/threads.h"
#include "io/config.h"
#include "machine_peak.h"
#include "model/planner.h"
#include "train/run_config.h"
#include "train/trainer.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

std::string g_run = std::string(K3_SOURCE_DIR) + "/bench/training/mid-512.json";
std::string g_out = "bench-train-out";
int g_threads = 2;
int64_t g_warmup = 2, g_steps = 4;

struct StepFigures {
  int64_t tokens = 0, seq_len = 0;
  double fwd_bwd_s = 0, update_s = 0, total_s = 0, maxvio = 0, last_loss = 0;
};
StepFigures g_fig;
K3Config g_cfg;

const std::string kSgemm = "machine/sgemm_openblas/2048", kStep = "train/step";
double sgemm_peak() { return bench::rate(kSgemm, bench::counter(kSgemm, "flop")); }

void BM_TrainStep(benchmark::State& st) {
  const RunConfig run = load_run_config(g_run);
  g_cfg = load_config(run.model_config);
  std::error_code ec;
  fs::remove_all(g_out, ec);
  TrainOptions opt;
  opt.out_dir = g_out;
  opt.threads = g_threads;
  opt.quiet = true;
  Trainer tr(run, opt);
  for (int64_t i = 0; i < g_warmup; ++i) {
    const StepStats s = tr.step();
    std::printf("warm-up step %ld: %.2f s, loss %.4f\n", long(s.step), s.seconds, s.loss);
  }
  g_fig = {};
  for (auto _ : st) {
    const StepStats s = tr.step();
    g_fig.tokens = s.tokens, g_fig.seq_len = s.seq_len;
    g_fig.fwd_bwd_s += s.seconds_fwd_bwd, g_fig.update_s += s.seconds_update, g_fig.total_s += s.seconds;
    for (double v : s.maxvio) g_fig.maxvio = std::max(g_fig.maxvio, v);
    g_fig.last_loss = s.loss;
  }
  const double flops_tok = 3.0 * forward_flops_per_token(g_cfg, g_fig.seq_len).total();
  st.counters["tok/s"] = benchmark::Counter(double(g_fig.tokens), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["model_GFLOP/s"] =
      benchmark::Counter(flops_tok * double(g_fig.tokens) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["tokens"] = double(g_fig.tokens);  // per iteration
  st.counters["flop"] = flops_tok * double(g_fig.tokens);
  st.counters["fwd_bwd"] = g_fig.fwd_bwd_s / g_fig.total_s;
  st.counters["update"] = g_fig.update_s / g_fig.total_s;
  st.counters["maxvio"] = g_fig.maxvio;
}

void summary() {
  if (!bench::results().count(kStep)) return;
  const double peak = sgemm_peak();
  const double tok_s = bench::rate(kStep, bench::counter(kStep, "tokens"));
  const double gflops = bench::rate(kStep, bench::counter(kStep, "flop")) / 1e9;
  const Flops f = forward_flops_per_token(g_cfg, g_fig.seq_len);
  std::printf("\n=== Training step (%s: d %ld, %ld layers, %ld experts top-%ld, latent %ld; %d threads; load average"
              " now %s) ===\n",
              g_run.c_str(), long(g_cfg.hidden_size), long(g_cfg.num_hidden_layers), long(g_cfg.num_experts),
              long(g_cfg.num_experts_per_token), long(g_cfg.routed_expert_hidden_size), num_threads(),
              bench::load_average().c_str());
  std::printf("machine: OpenBLAS sgemm 2048 %.1f GFLOP/s\n", peak / 1e9);
  std::printf("model FLOPs per token (training = 3 x forward at T=%ld): %.1f MFLOP (forward: matmul %.1f, MLA attention"
              " %.2f, KDA state %.2f, conv %.3f MFLOP)\n",
              long(g_fig.seq_len), 3 * f.total() / 1e6, f.matmul / 1e6, f.mla_attn / 1e6, f.kda_state / 1e6,
              f.conv / 1e6);
  std::printf("step of %ld tokens: %.1f tok/s, %.1f model GFLOP/s = MFU %.1f%% of the sgemm peak (target >= 30%%);"
              " forward+backward %.0f%% of the step, clipping+optimiser+balancer %.0f%%; max MaxVio %.2f, last loss"
              " %.4f\n",
              long(g_fig.tokens), tok_s, gflops, 100 * gflops * 1e9 / peak, 100 * bench::counter(kStep, "fwd_bwd"),
              100 * bench::counter(kStep, "update"), g_fig.maxvio, g_fig.last_loss);
}

}  // namespace

int main(int argc, char** argv) {
  int w = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* key) { return a.rfind(key, 0) == 0 ? a.c_str() + std::strlen(key) : nullptr; };
    if (const char* v = val("--run=")) g_run = v;
    else if (const char* v = val("--out=")) g_out = v;
    else if (const char* v = val("--threads=")) g_threads = std::stoi(v);
    else if (const char* v = val("--warmup=")) g_warmup = std::stoll(v);
    else if (const char* v = val("--steps=")) g_steps = std::stoll(v);
    else argv[w++] = argv[i];
  }
  argc = w;
  set_num_threads(g_threads);
  std::printf("load average at start: %s\n", bench::load_average().c_str());
  benchmark::RegisterBenchmark("machine/sgemm_openblas", bench::BM_MachineSgemm)
      ->Arg(2048)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(kStep.c_str(), BM_TrainStep)
      ->Iterations(g_steps)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    bench::Capture rep;
    benchmark::RunSpecifiedBenchmarks(&rep);
    summary();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_step: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
