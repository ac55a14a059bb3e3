// Shared by the DistRanks suites (tests/dist): a communicator and data-parallel group, a
// directory every rank sees, and a training run traced step by step.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/data_parallel.h"
#include "model/checkpoint.h"
#include "train/parallel.h"
#include "train/run_config.h"
#include "train/test_trainer_util.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace k3::test {

struct Group {
  std::unique_ptr<dist::Comm> comm;
  std::unique_ptr<dist::CommDataParallel> dp;
  explicit Group(int64_t bucket_bytes = int64_t(4) << 20) {
    comm = dist::make_comm("mpi", 120);
    dp = std::make_unique<dist::CommDataParallel>(*comm, bucket_bytes);
  }
};

// A directory every rank sees: made by rank 0 (which removes it at the end), path broadcast.
struct SharedDir {
  DataParallel& dp;
  std::unique_ptr<TrainTempDir> owner;
  std::string path;
  explicit SharedDir(DataParallel& d) : dp(d) {
    char buf[512] = {0};
    if (dp.rank() == 0) {
      owner = std::make_unique<TrainTempDir>();
      std::snprintf(buf, sizeof buf, "%s", owner->path.c_str());
    }
    dp.broadcast_bytes(buf, sizeof buf, 0, "test.dir");
    path = buf;
  }
  ~SharedDir() { dp.barrier("test.dir.done"); }
};

// What a run did at every step, and at its end.
struct Trace {
  std::vector<double> loss, gnorm;
  std::vector<std::string> grads_hash, weights_hash;
  std::vector<float> weights, opt_state;
  std::string evals, ckpt_weights_hash, ckpt_opt_hash;
  // Expert parallel: the other ranks' experts' bytes resident in this rank's weight and
  // gradient buffers at the end of the run, and after gathering them (the probe sees pages).
  int64_t foreign_resident = -1, foreign_resident_synced = -1;
};

// got's per-step losses, gradient norms and gradient and weight hashes are ref's, bit for bit.
inline void expect_same_steps(const Trace& got, const Trace& ref, const std::string& name) {
  ASSERT_EQ(got.loss.size(), ref.loss.size()) << name;
  for (size_t i = 0; i < ref.loss.size(); ++i) {
    EXPECT_EQ(got.loss[i], ref.loss[i]) << name << " step " << i + 1;
    EXPECT_EQ(got.gnorm[i], ref.gnorm[i]) << name << " step " << i + 1;
    EXPECT_EQ(got.grads_hash[i], ref.grads_hash[i]) << name << " step " << i + 1 << " gradients";
    EXPECT_EQ(got.weights_hash[i], ref.weights_hash[i]) << name << " step " << i + 1 << " weights";
  }
}

// ep (optional): expert parallel over dp's ranks (zero: ZeRO-1 of the trunk). dp_overlap:
// TrainOptions::dp_overlap (the reduction overlapped with the last backward).
inline Trace trace_run(const std::string& run_path, const std::string& out, int threads, DataParallel* dp, bool zero,
                       ExpertParallelTraining* ep = nullptr, bool dp_overlap = true) {
  TrainOptions o;
  o.out_dir = out;
  o.quiet = true;
  o.threads = threads;
  o.dp = dp;
  o.shard_optimizer = zero;
  o.ep = ep;
  o.dp_overlap = dp_overlap;
  Trainer t(load_run_config(run_path), o);
  Trace tr;
  int64_t total = 0;
  for (size_t s = 0; s < t.run_config().stages.size(); ++s) total += t.stage_steps(s);
  for (int64_t i = 0; i < total; ++i) {
    const StepStats s = t.step();
    tr.loss.push_back(s.loss);
    tr.gnorm.push_back(s.grad_norm);
    const std::vector<float> g = t.last_gradients();
    tr.grads_hash.push_back(content_hash(g.data(), g.size() * sizeof(float)));
    t.sync_expert_weights();
    const WeightStore& w = t.model().weights();
    tr.weights_hash.push_back(content_hash(w.data(), size_t(w.size()) * sizeof(float)));
    t.release_foreign_experts();  // back to what training holds
  }
  t.run();  // the final checkpoint
  tr.foreign_resident = t.foreign_expert_resident_bytes();
  tr.opt_state = t.optimizer_state();
  t.sync_expert_weights();
  tr.foreign_resident_synced = t.foreign_expert_resident_bytes();
  const WeightStore& w = t.model().weights();
  tr.weights.assign(w.data(), w.data() + w.size());
  if (!dp || dp->rank() == 0) {
    std::istringstream in(read_text(out + "/metrics.jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j["type"] == "eval")
        tr.evals += j["step"].dump() + " " + j["loss"].dump() + " " + j["bpb"].dump() + " " + j["maxvio"].dump() + "\n";
    }
    std::vector<float> os;
    const int64_t n = int64_t(tr.opt_state.size());
    const TrainState st = load_train_state(out + "/checkpoint/train_state.safetensors", os, n);
    tr.ckpt_weights_hash = st.weights_hash;
    tr.ckpt_opt_hash = st.optimizer_hash;
  }
  return tr;
}


}  // namespace k3::test
