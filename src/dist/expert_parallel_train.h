// Expert parallelism in training over MPI (`mpirun -np N k3cpp train ... --dp N --ep G`;
// docs/distributed.md): train/parallel.h's ExpertParallelTraining and the kernels'
// ExpertTrainExchange (kernels/moe_exchange.h) in one object.
//  - Groups: world ranks [g G, (g + 1) G) form group g (a communicator of their own); rank j
//    of every group owns routed experts [j E/G, (j + 1) E/G) of every MoE layer; the ranks
//    holding the same experts (one per group, N/G of them) form a replica communicator.
//  - Forward of a MoE layer: counts first (each source sends each owner how many of its rows
//    go to each of the owner's experts: a fixed-size all-to-all, MPI_Ialltoallv with equal
//    counts), then the rows (z of each (token, slot), dispatch order) with MPI_Ialltoallv; the
//    owner runs each expert on each source's rows separately (the rows, and their order, one
//    process computes for that sequence), keeps the rows and [W1 z | W3 z] for the backward,
//    and returns the outputs with a non-blocking MPI_Ialltoallv, during which the source runs
//    its shared experts (the overlap callback). Dropless: every row goes.
//  - Backward: the sources send p du per row (the output gradients) to the owners with the
//    forward's counts, running their shared experts' weight gradients while those travel (the
//    overlap callback); the owners accumulate their experts' parameter gradients and return
//    the rows' dz. A sequence's layers come back in reverse order: saved frames are a stack.
//  - Gradients: the owner accumulates each source rank's contribution in its own buffer (as
//    that rank's thread would in one process), so reduce_gradients can sum them in world
//    rank order, bit for bit the single process's thread-order sum; with N/G > 1 replicas the
//    owners' buffers are first all-gathered over the replica communicator (a few experts at a
//    time). The price: per MoE layer, G - 1 buffers of E/G experts besides the experts' own
//    gradient (this rank's tokens accumulate there): together the size of all the layer's
//    experts, as one process of N threads holds a gradient buffer per thread; it does not
//    shrink with G. Fused (per_source false), the sources accumulate into the experts' own
//    gradient in rank order within each call (no accumulators; not the single process's
//    summation: equal to rounding, deterministic).
// Byte counts (comm.h) go to this object's communicators, labelled ep.fwd.counts,
// ep.fwd.dispatch, ep.fwd.combine, ep.bwd.dispatch, ep.bwd.combine and ep.grad.replicas;
// stats() merges them. MPI only (the sub-communicators are MPI's).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/mpi_comm.h"
#include "kernels/moe_exchange.h"
#include "train/parallel.h"

namespace k3::dist {

class CommExpertTraining : public ExpertParallelTraining, public ExpertTrainExchange {
 public:
  // world: the job's communicator (its size a multiple of group_size). per_source = false
  // (--ep-accumulate fused): every source's rows accumulate into the expert's one gradient,
  // the sources in rank order per MoE layer call: no accumulators, deterministic, but a
  // different float summation than one process (equal to float rounding, not bitwise).
  CommExpertTraining(const MpiComm& world, int group_size, bool per_source = true);
  bool per_source() const { return per_source_; }
  int size() const override { return G_; }
  int rank() const override { return j_; }
  int group() const override { return g_; }
  ExpertTrainExchange* exchange() override { return this; }
  void bind_gradients(const std::vector<std::vector<ExpertGrad>>& owned, int64_t n_in, int64_t F) override;
  void begin_step() override;
  void reduce_gradients() override;

  void forward(float* y, const float* rows, const MoEDispatch& dp, const ExpertMatrix* w1, const ExpertMatrix* w3,
               const ExpertMatrix* w2, int64_t E, int64_t n_in, int64_t F, double b1, double b2,
               const std::function<void()>& overlap) override;
  void backward(float* dz, const float* dy, const MoEDispatch& dp, const ExpertMatrix* w1, const ExpertMatrix* w3,
                const ExpertMatrix* w2, int64_t E, int64_t n_in, int64_t F, double b1, double b2,
                const std::function<void()>& overlap) override;

  // Both communicators' byte counts, by label.
  std::map<std::string, CollectiveStats> stats() const;
  // Rows this rank sent to other ranks' experts in forwards since construction (the
  // routing's count: ep.fwd.dispatch bytes = this x n_in x 4).
  int64_t rows_sent() const { return rows_sent_; }

 private:
  struct Frame {
    std::vector<int64_t> counts;  // [G, E/G]: rows from source q for this rank's expert i
    std::vector<int64_t> begin;   // [G * E/G + 1]: where each (q, i) block starts in rows
    std::vector<float> rows, gu;  // received z [n, n_in], [W1 z | W3 z] [n, 2F]
  };
  void peer_layout(const MoEDispatch& dp, int64_t E, int64_t row_bytes);
  Frame& frame_of(const MoEDispatch& dp, int64_t E, int64_t n_in, bool forward);
  ExpertGrad grad_of(size_t layer, int q, int64_t i) const;

  std::unique_ptr<MpiComm> group_, replica_;
  int G_ = 1, j_ = 0, g_ = 0, D_ = 1;
  bool per_source_ = true;
  std::vector<Frame> frames_;
  size_t depth_ = 0;  // frames in use (MoE layers forwarded and not yet backpropagated)
  std::vector<std::vector<ExpertGrad>> bound_;
  std::vector<std::vector<float>> acc_;  // per layer: [G - 1 other sources][E/G experts][w1 | w3 | w2]
  static constexpr int64_t kReplicaChunkBytes = int64_t(8) << 20;  // gathered at once in reduce_gradients
  int64_t n_in_ = 0, F_ = 0;
  std::vector<int64_t> sc_, sd_, rc_, rd_;  // per-peer byte counts and displacements
  std::vector<float> out_, work_, dyr_;  // grow only: steady-state calls do not allocate
  std::vector<int64_t> mine_;
  int64_t rows_sent_ = 0;
};

}  // namespace k3::dist
