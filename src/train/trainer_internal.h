// Internals of the training run shared by the trainer's files (trainer_impl.h) and tests.
// ShardedOptimizer: train/optimizer.h's Optimizer over consecutive ranges of the parameter
// list, stepped in parallel (OpenMP, one shard per task). Optimizer::step is serial, and
// with 896 experts per layer the routed experts alone are thousands of Muon matrices, each
// orthogonalised by small matrix products: sharding uses every core. The concatenated
// shard states equal one Optimizer's state, so checkpoints do not depend on the shard count.
#pragma once
#include <memory>
#include <vector>

#include "train/metrics.h"
#include "train/optimizer.h"

namespace k3 {

class ShardedOptimizer {
 public:
  // Shards of about equal estimated cost (Newton-Schulz flops for Muon, elements for AdamW).
  // lr_scale (optional, one per parameter): parameter i steps with lr * lr_scale[i]; a shard
  // never mixes scales.
  ShardedOptimizer(std::vector<ParamRef> params, const OptimizerOptions& o, int shards,
                   const std::vector<double>& lr_scale = {});
  void step(double lr);
  int64_t steps() const;
  void set_steps(int64_t t);
  int64_t state_elements() const;  // 2 * total parameter elements
  void get_state(std::vector<float>& out);
  void set_state(const std::vector<float>& in);
  const std::vector<ParamRef>& params() const { return params_; }
  size_t shards() const { return shards_.size(); }

 private:
  std::vector<ParamRef> params_;
  std::vector<std::unique_ptr<Optimizer>> shards_;
  std::vector<double> shard_scale_;
  int64_t t_ = 0;  // steps taken (also when this holds no parameter: a rank that owns none)
};

// Estimated optimiser work of one parameter (the cost ShardedOptimizer balances): AdamW ~ 12
// flops per element; Muon per head block 5 Newton-Schulz iterations.
double optimizer_cost(const ParamRef& p);

// Cuts params into `parts` consecutive runs of about equal optimizer_cost (whole parameters:
// a Muon matrix is never split); returns parts + 1 indices, cut[0] = 0, cut[parts] = size.
std::vector<size_t> partition_params(const std::vector<ParamRef>& params, int parts);

}  // namespace k3
