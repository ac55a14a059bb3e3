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
// With --torch, a third benchmark, torch/step, trains the same model from the same initial
// weights (the run's init, saved as a checkpoint) on the same corpus (the run's train token
// stream) with the same batch (batch_tokens / seq_len sequences of seq_len per optimiser step)
// and thread count in the PyTorch implementation, tools/k3_torch_train_bench.py (Debian's
// python3-torch; AdamW, chunked KDA, experts grouped by index_select): one iteration = one
// run of the script (1 warm-up step, then --steps timed steps; its own timing). The summary
// prints k3cpp's tokens/s over PyTorch's (issue 4 target: >= 2x). The fair comparison is a run
// file with AdamW and no balancer (the script keeps the router bias fixed):
// bench/training/demo-896-adamw.json. Both engines inherit OMP_WAIT_POLICY from the
// environment (PASSIVE keeps torch's OpenMP threads from spinning on a busy machine).
// Own flags (removed before Google Benchmark sees argv): --run=FILE (default
// bench/training/mid-512.json), --threads=N (default 2), --warmup=N (default 2), --steps=N
// (timed, default 4), --seq_len=N (every stage's sequence length instead of the run file's;
// it must divide micro_batch_tokens), --out=DIR (scratch output; default bench-train-out in
// the current directory, removed at the start), --torch (add torch/step),
// --python=PATH (default /usr/bin/python3).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_results.h"
#include "core/error.h"
#include "core/threads.h"
#include "infer/mem_probe.h"
#include "io/config.h"
#include "io/vocabulary.h"
#include "machine_peak.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "model/planner.h"
#include "train/data.h"
#include "train/run_config.h"
#include "train/trainer.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

std::string g_run = std::string(K3_SOURCE_DIR) + "/bench/training/mid-512.json";
std::string g_out = "bench-train-out";
int g_threads = 2;
int64_t g_warmup = 2, g_steps = 4, g_seq_len = 0;
bool g_torch = false;
std::string g_python = "/usr/bin/python3";

struct StepFigures {
  int64_t tokens = 0, seq_len = 0;
  double fwd_bwd_s = 0, update_s = 0, total_s = 0, maxvio = 0, last_loss = 0;
};
StepFigures g_fig;
K3Config g_cfg;

const std::string kSgemm = "machine/sgemm_openblas/2048", kStep = "train/step", kTorch = "torch/step";
double sgemm_peak() { return bench::rate(kSgemm, bench::counter(kSgemm, "flop")); }

// The run file, with --seq_len applied to every stage.
RunConfig bench_run() {
  RunConfig run = load_run_config(g_run);
  if (g_seq_len > 0)
    for (StageConfig& sc : run.stages) {
      if (run.micro_batch_tokens % g_seq_len != 0)
        fail("bench: --seq_len=" + std::to_string(g_seq_len) + " does not divide micro_batch_tokens " +
             std::to_string(run.micro_batch_tokens) + " of " + g_run);
      sc.seq_len = g_seq_len;
    }
  return run;
}

void BM_TrainStep(benchmark::State& st) {
  const RunConfig run = bench_run();
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
    std::printf("warm-up step %ld: %.2f s, loss %.4f, max MaxVio %.2f\n", long(s.step), s.seconds, s.loss,
                s.maxvio.empty() ? 0.0 : *std::max_element(s.maxvio.begin(), s.maxvio.end()));
    std::fflush(stdout);
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
  // Memory: the training records' activations per token (one sequence per thread) and the
  // process's peak resident set (weights, gradients, optimiser state, activations).
  st.counters["act_KB_per_token"] = double(tr.activation_bytes()) / 1024.0 / double(g_threads * g_fig.seq_len);
  st.counters["peak_RSS_GB"] = double(read_proc_mem().vm_hwm) / 1e9;
}

// The PyTorch implementation on the run's model, weights, corpus, batch and thread count.
void BM_TorchStep(benchmark::State& st) {
  const RunConfig run = bench_run();
  const K3Config cfg = load_config(run.model_config);
  const StageConfig& sc = run.stages.at(0);
  const int64_t T = sc.seq_len, B = run.batch_tokens / sc.seq_len;
  const fs::path dir = fs::path(g_out + "-torch");
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  InitOptions io;
  io.seed = run.init_seed >= 0 ? uint64_t(run.init_seed) : run.seed;  // the Trainer's init
  save_checkpoint((dir / "init").string(), init_weights(cfg, io));
  const Vocabulary tok;  // the torch comparison reads byte tokens
  const CorpusSplit data = split_and_tokenize(load_corpus(run.data), tok, run.heldout_every);
  const std::string tokens = (dir / "train.i32").string();
  {
    std::ofstream f(tokens, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.train.data()), std::streamsize(data.train.size() * sizeof(int32_t)));
    if (!f) fail("bench: cannot write " + tokens);
  }
  const std::string cmd = g_python + " " + std::string(K3_SOURCE_DIR) + "/tools/k3_torch_train_bench.py --model " +
                          (dir / "init").string() + " --tokens " + tokens + " --batch " + std::to_string(B) +
                          " --seq " + std::to_string(T) + " --steps " + std::to_string(g_steps) +
                          " --warmup 1 --threads " + std::to_string(num_threads()) + " --lr " +
                          std::to_string(sc.lr_peak);
  std::printf("torch: %s\n", cmd.c_str());
  double tok_s = 0;
  for (auto _ : st) {
    std::FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) fail("bench: cannot start " + g_python);
    std::string out;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    const int rc = ::pclose(p);
    if (rc != 0) fail("bench: " + cmd + " exited with status " + std::to_string(rc) + ": " + out);
    const size_t brace = out.rfind('{');
    if (brace == std::string::npos) fail("bench: " + cmd + " printed no JSON result: " + out);
    const std::string line = out.substr(brace);
    const nlohmann::json j = nlohmann::json::parse(line);
    st.SetIterationTime(j.at("seconds").get<double>());
    tok_s = j.at("tokens_per_s").get<double>();
    std::printf("torch: %s", line.c_str());
  }
  st.counters["tok/s"] = tok_s;
  st.counters["tokens"] = double(B * T * g_steps);
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
  if (bench::results().count(kTorch)) {
    const double torch_tok_s = bench::rate(kTorch, bench::counter(kTorch, "tokens"));
    std::printf("PyTorch implementation (same model, weights, corpus, batch, %d threads): %.1f tok/s; k3cpp / PyTorch ="
                " %.2fx (target >= 2x)\n",
                num_threads(), torch_tok_s, tok_s / torch_tok_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::take_own_flags(argc, argv, [](const std::string& a, auto val) {
    if (const char* v = val("--run=")) g_run = v;
    else if (const char* v = val("--out=")) g_out = v;
    else if (const char* v = val("--threads=")) g_threads = std::stoi(v);
    else if (const char* v = val("--warmup=")) g_warmup = std::stoll(v);
    else if (const char* v = val("--steps=")) g_steps = std::stoll(v);
    else if (const char* v = val("--python=")) g_python = v;
    else if (const char* v = val("--seq_len=")) g_seq_len = std::stoll(v);
    else if (a == "--torch") g_torch = true;
    else return false;
    return true;
  });
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
  if (g_torch)
    benchmark::RegisterBenchmark(kTorch.c_str(), BM_TorchStep)
        ->Iterations(1)
        ->UseManualTime()
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
