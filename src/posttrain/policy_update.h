// What SFT, RL and distillation share: the policy being trained (a K3Model with f32 experts),
// one gradient buffer and TrainScratch per thread, the optimiser (train/trainer.h's
// assignment: per-head Muon + AdamW, or AdamW) and the checkpoint of all of it.
//
// A step: zero the gradients, run a per-sequence function over the batch in parallel (one
// sequence per thread, static schedule, per-thread gradients summed in thread order: a run is
// deterministic for a given thread count), clip the global norm, take the optimiser step.
// The router bias is frozen in post-training (no balancer runs; it gets no gradient).
//
// Checkpoint: DIR is a model directory (config.json, the weights f32, the vocabulary files)
// plus posttrain_state.json (the counters and the caller's JSON state) and optimizer.bin (the
// moments, raw f32), all written into one temporary directory that replaces DIR as a whole
// (model/checkpoint.h), so a crash leaves the previous checkpoint intact.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/vocabulary.h"
#include "model/k3_model.h"
#include "train/model_grad.h"

namespace k3 {

struct UpdateOptions {
  std::string optimizer = "adamw";  // adamw | muon
  double weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95, grad_clip = 1.0;
  int threads = 1;
};

struct UpdateStats {
  double grad_norm = 0;  // before clipping
  double seconds = 0;
};

class PolicyUpdater {
 public:
  PolicyUpdater(K3Model& model, const UpdateOptions& opt);
  ~PolicyUpdater();
  // body(i, grads, scratch) for i in [0, n), then clip + optimiser step with lr. body adds the
  // gradient of its sequence's share of the loss into grads.
  using SequenceBody = std::function<void(int64_t i, float* grads, TrainScratch& s)>;
  UpdateStats step(int64_t n, const SequenceBody& body, double lr);
  // Only the gradient (summed into gradient(), no step): tests and diagnostics.
  void accumulate(int64_t n, const SequenceBody& body);
  const float* gradient() const;
  int threads() const { return P_; }
  TrainScratch& scratch(int t);
  K3Model& model() { return model_; }

  // Saves DIR (see above); `state` is stored under "state" in posttrain_state.json; `extra`
  // writes the caller's further files into the temporary directory before it replaces DIR.
  void save(const std::string& dir, const Vocabulary& vocab, const nlohmann::json& state,
            const std::function<void(const std::string& tmp)>& extra = {}) const;
  // Loads the optimiser moments and returns the caller's state from DIR (written by save);
  // the weights must already be the checkpoint's (load_model(dir)). k3::Error naming the file
  // and field for a missing, malformed or mismatched state.
  nlohmann::json load_state(const std::string& dir);

 private:
  struct Impl;
  K3Model& model_;
  int P_ = 1;
  std::unique_ptr<Impl> impl_;
};

// Deterministic 64-bit mixing (splitmix64) for seeded choices independent of the std library.
uint64_t mix64(uint64_t x);

}  // namespace k3
