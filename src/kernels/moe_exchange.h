// Expert parallelism at inference (src/dist, docs/distributed.md): the process is one of R
// ranks that run the same tokens through the same trunk, and computes only the routed experts
// it owns; the (token, slot) rows of the other experts come from their owners before the
// combine. Set once per process (a distributed `generate`); unset, every expert is local.
// moe_experts_forward (kernels/moe.h) consults it on the resident path; an expert provider
// (memory-limited inference) and training (saved activations) refuse it.
#pragma once
#include <cstdint>

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

}  // namespace k3
