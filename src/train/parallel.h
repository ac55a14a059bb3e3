// What a data-parallel training run needs from its group of ranks (train/trainer.h,
// TrainOptions::dp). The interface lives here so the trainer depends on no transport; src/dist
// implements it over MPI (and NCCL when built with CUDA). Every call is collective over the
// group: each rank makes the same calls in the same order, with the sizes stated below.
// `label` names the call in the backend's byte counters and in its timeout message.
//
// Determinism: nothing here sums floats in an order the backend chooses. reduce_sum_ordered
// sums in rank order, ((g_0 + g_1) + g_2) + ..., which is the order in which a single process
// with one thread per rank sums its per-thread gradient buffers (trainer_reduce.cpp), so N ranks of
// one thread reproduce one process of N threads bit for bit. Integer sums are exact in any
// order; gathers move bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/moe.h"

namespace k3 {

class ExpertTrainExchange;  // kernels/moe_exchange.h

// A reduce_sum_ordered begun while the gradient is still being computed
// (DataParallel::begin_reduce_sum_ordered): the reduction of each part starts as soon as the
// caller says that part is final, and the result is reduce_sum_ordered's, bit for bit.
// Collective: every rank makes the same ready() calls in the same order (the backward's, the
// same on every rank) and no other DataParallel call until finish() (the transport matches
// collectives by the order in which they are started).
class OrderedReduction {
 public:
  virtual ~OrderedReduction() = default;
  // g[lo, hi) holds this rank's final values (disjoint ranges; each element at most once).
  virtual void ready(int64_t lo, int64_t hi) = 0;
  // Lets the exchanges in flight progress and sums those that have arrived; never waits.
  virtual void poll() = 0;
  // Every part not yet reported is taken as final; returns once g holds what
  // reduce_sum_ordered would have left there.
  virtual void finish() = 0;
};

class DataParallel {
 public:
  virtual ~DataParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // g[0, n) on every rank; bounds [size() + 1] (bounds[0] = 0, bounds[size()] = n) splits it into
  // the ranks' owned ranges. Afterwards rank r's range [bounds[r], bounds[r + 1]) holds the
  // rank-ordered sum of every rank's values there; with all = true every range does (a
  // reduce-scatter, then an all-gather of the owned ranges), else the rest of g is left
  // unspecified (ZeRO-1: each rank steps only what it owns).
  virtual void reduce_sum_ordered(float* g, int64_t n, const std::vector<int64_t>& bounds, bool all,
                                  const char* label) = 0;
  // The same reduction, progressive (OrderedReduction above): g must stay valid, and its
  // reported ranges unwritten, until finish() returns.
  virtual std::unique_ptr<OrderedReduction> begin_reduce_sum_ordered(float* g, int64_t n,
                                                                     const std::vector<int64_t>& bounds, bool all,
                                                                     const char* label) = 0;
  // x[0, n): each rank's range [bounds[r], bounds[r + 1]) goes from its owner to every rank.
  virtual void allgather_ranges(float* x, const std::vector<int64_t>& bounds, const char* label) = 0;
  // Element-wise sum of v[0, n) over the ranks (exact), on every rank.
  virtual void allreduce_sum_i64(int64_t* v, int64_t n, const char* label) = 0;
  // Every rank's `bytes` bytes (sizes may differ), concatenated in rank order, on every rank;
  // counts (optional) receives each rank's size.
  virtual void allgatherv_bytes(const void* mine, size_t bytes, std::vector<unsigned char>& out,
                                std::vector<size_t>* counts, const char* label) = 0;
  // The same concatenation on `root` only (the others' out is left empty): what a checkpoint
  // needs on the rank that writes it, without a copy of everything on every rank.
  virtual void gatherv_bytes(const void* mine, size_t bytes, int root, std::vector<unsigned char>& out,
                             std::vector<size_t>* counts, const char* label) = 0;
  virtual void broadcast_bytes(void* data, size_t bytes, int root, const char* label) = 0;
  virtual void barrier(const char* label) = 0;

  // Typed gathers over allgatherv_bytes.
  template <typename T>
  std::vector<T> allgatherv(const T* mine, size_t n, const char* label, std::vector<size_t>* counts = nullptr) {
    std::vector<unsigned char> raw;
    allgatherv_bytes(mine, n * sizeof(T), raw, counts, label);
    std::vector<T> out(raw.size() / sizeof(T));
    if (!raw.empty()) __builtin_memcpy(out.data(), raw.data(), raw.size());
    if (counts)
      for (size_t& c : *counts) c /= sizeof(T);
    return out;
  }
  template <typename T>
  std::vector<T> gatherv(const T* mine, size_t n, int root, const char* label, std::vector<size_t>* counts = nullptr) {
    std::vector<unsigned char> raw;
    gatherv_bytes(mine, n * sizeof(T), root, raw, counts, label);
    std::vector<T> out(raw.size() / sizeof(T));
    if (!raw.empty()) __builtin_memcpy(out.data(), raw.data(), raw.size());
    if (counts)
      for (size_t& c : *counts) c /= sizeof(T);
    return out;
  }
  // Refuses (k3::Error on every rank, naming the ranks) unless every rank holds the same bytes:
  // a 64-bit content hash of them is gathered and compared.
  void check_identical(const void* data, size_t bytes, const std::string& what);
};

// Expert parallelism in training (TrainOptions::ep; src/dist/expert_parallel_train.h). The
// job's ranks (DataParallel, N of them) form N / size() groups of size() consecutive ranks
// (world rank = group() x size() + rank()); in every group, rank j owns routed experts
// [j E / size(), (j + 1) E / size()) of every MoE layer: it alone computes them (the kernels'
// ExpertTrainExchange brings it the group's rows), holds their summed gradients and steps
// them. Every rank still trains its own 1/N of each micro-batch, as in data parallelism.
// Collective like DataParallel.
class ExpertParallelTraining {
 public:
  virtual ~ExpertParallelTraining() = default;
  virtual int size() const = 0;   // ranks per group
  virtual int rank() const = 0;   // this rank within its group
  virtual int group() const = 0;  // which group (the experts' data-parallel replica)
  bool owns(int64_t e, int64_t E) const { return e / (E / size()) == rank(); }
  virtual ExpertTrainExchange* exchange() = 0;  // set around the training forwards and backwards
  // Where the step's summed gradients of this rank's experts go: per MoE layer, one view per
  // owned expert (ascending); w1, w3 [F, n_in], w2 [n_in, F]. Called once before training.
  virtual void bind_gradients(const std::vector<std::vector<ExpertGrad>>& owned, int64_t n_in, int64_t F) = 0;
  virtual void begin_step() = 0;  // before the step's first forward: the accumulators to zero
  // After the step's backwards: every bound view holds the sum over every rank of the job
  // (each rank's tokens' contribution, accumulated on the owner as that rank would have) in
  // world rank order, ((g_0 + g_1) + g_2) + ..., as reduce_sum_ordered sums.
  virtual void reduce_gradients() = 0;
};

}  // namespace k3
