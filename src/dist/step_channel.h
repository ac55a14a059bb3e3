// Expert-parallel serving over a dist::Comm (`mpirun -np R k3cpp serve MODEL --ep R`): the
// engine's StepChannel (infer/engine.h) as a broadcast from rank 0. Rank 0 runs the HTTP server
// and the scheduler; before each model forward its engine shares what it decided since the
// last one (requests admitted, tokens sampled, sequences ended), and ranks 1..R-1 apply it to
// engine states of their own (run_engine_follower) and run the same forward, computing their
// routed experts and taking part in each MoE layer's all-gather (dist/expert_parallel.h).
// Sampling happens on rank 0 only: a follower needs neither the sampler nor the constraints.
// Messages fit one fixed-size broadcast (a size word and kInline bytes) unless an admission
// carries image rows, which then follow in a second one.
#pragma once
#include <string>
#include <vector>

#include "dist/comm.h"
#include "infer/engine.h"

namespace k3::dist {

class CommStepChannel : public StepChannel {
 public:
  static constexpr int64_t kInline = 1024 - 8;
  explicit CommStepChannel(Comm& comm) : comm_(comm) {}
  void share(std::string& bytes) override;
  [[noreturn]] void abort(const std::string& msg) override;

 private:
  Comm& comm_;
  std::vector<char> buf_;
};

}  // namespace k3::dist
