// Expert parallelism at inference (src/dist, docs/distributed.md): the process is one of R
// ranks that run the same tokens through the same trunk, and computes only the routed experts
// it owns; the (token, slot) rows of the other experts come from their owners before the
// combine. Set once per process (a distributed `generate`); unset, every expert is local.
// moe_experts_forward (kernels/moe.h) consults it on the resident path; an expert provider
// (memory-limited inference) and training (saved activations) refuse it.
#pragma once
#include <cstdint>
#include <functional>

#include "kernels/moe.h"

namespace k3 {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // Whether this rank computes expert e of E.
  virtual bool owns(int64_t e, int64_t E) const = 0;
  // slots [Tn * k, n_in]: this rank's experts' rows are filled (dispatch order in dp); fills the
  // rows of every other expert from its owner. Collective: every rank calls it with the same
  // routing.
  virtual void exchange(float* slots, const MoEDispatch& dp, int64_t Tn, int64_t k, int64_t E, int64_t n_in) = 0;
};

void set_expert_exchange(ExpertExchange* ex);  // nullptr: every expert local
ExpertExchange* expert_exchange();

// Expert parallelism in training (src/dist/expert_parallel_train.h): each rank has its own
// tokens and computes only the routed experts it owns. The grouped training forward and
// backward (moe_experts_forward with saves, moe_experts_backward) hand their (token, slot)
// rows, in dispatch order (expert, then token), to this exchange, which sends them to the
// experts' owners, has the owners run each expert on each source rank's rows separately
// (moe_expert_rows_forward / _backward: the very rows, in the very order, of one process
// running that sequence), and brings the results back. The owners keep the rows and [W1 z |
// W3 z] the backward needs, and accumulate the experts' parameter gradients themselves (per
// source rank), so the caller's gradient views of routed experts are not touched. Set by the
// trainer around its training forwards and backwards only; collective over the group (every
// rank calls forward / backward for the same layers in the same order).
class ExpertTrainExchange {
 public:
  virtual ~ExpertTrainExchange() = default;
  // rows [Tn * k, n_in]: z of each (token, slot) in the order of dp. Fills y (same shape and
  // order) with W2 SiTU(W1 z, W3 z) per row (before the mixture weight). overlap() runs
  // exactly once, while the outputs travel back (the shared experts).
  virtual void forward(float* y, const float* rows, const MoEDispatch& dp, const ExpertMatrix* w1,
                       const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t E, int64_t n_in, int64_t F, double b1,
                       double b2, const std::function<void()>& overlap) = 0;
  // Backward of the latest forward not yet taken back (a sequence's MoE layers backpropagate
  // in reverse): dy [Tn * k, n_in] = p du per row (order of dp); fills dz with each row's
  // gradient of z. overlap() runs exactly once, while the rows travel to the owners.
  virtual void backward(float* dz, const float* dy, const MoEDispatch& dp, const ExpertMatrix* w1,
                        const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t E, int64_t n_in, int64_t F, double b1,
                        double b2, const std::function<void()>& overlap) = 0;
};

void set_expert_train_exchange(ExpertTrainExchange* ex);  // nullptr: every expert local
ExpertTrainExchange* expert_train_exchange();

}  // namespace k3
