// The op harness's performance mode (tests/ops/op_harness.h): every case of the table on every
// backend present, timed (the op queued, then the device synchronised, per iteration), with its
// nominal FLOP and byte counts as rates. The K3-sized cases (perf_only) run on device backends
// only: on 2 CPU cores one of them takes seconds per iteration; bench_kernels and
// bench_model_infer measure the CPU at its own sizes.
//   bench_ops --benchmark_filter=cuda          the GPU's cases
//   bench_ops --benchmark_filter='kda.*cuda'   one op
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "ops/op_harness.h"

using namespace k3;
using namespace k3::test;

namespace {

void run_case(benchmark::State& state, size_t ci, size_t bi) {
  const OpCase& c = op_cases()[ci];
  const HarnessBackend& be = harness_backends()[bi];
  OpBuffers b(be.ops->device());
  PreparedOp p = c.prepare(be, b, 1234 + ci, false);
  Device* dev = be.ops->device();
  p.run();  // warm-up: module load, handles, workspaces
  if (dev) dev->synchronize();
  for (auto _ : state) {
    p.run();
    if (dev) dev->synchronize();
  }
  if (c.flops > 0)
    state.counters["GFLOP/s"] = benchmark::Counter(c.flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (c.bytes > 0)
    state.counters["GB/s"] = benchmark::Counter(c.bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

const bool registered = [] {
  for (size_t ci = 0; ci < op_cases().size(); ++ci)
    for (size_t bi = 0; bi < harness_backends().size(); ++bi) {
      const HarnessBackend& be = harness_backends()[bi];
      const OpCase& c = op_cases()[ci];
      if (!be.ops || (c.perf_only && !be.ops->device()) || be.name == "emulated") continue;
      const std::string name = c.op + "/" + c.name + "/" + be.name;
      benchmark::RegisterBenchmark(name.c_str(), [ci, bi](benchmark::State& s) { run_case(s, ci, bi); })
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  return true;
}();

}  // namespace
