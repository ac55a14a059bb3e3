// Expert parallelism at inference over a dist::Comm (kernels/moe_exchange.h): `mpirun -np R
// k3cpp generate ... --ep R`. Every rank runs the trunk on the same tokens (so the routing is
// the same everywhere and every rank knows how many (token, slot) rows each owner produces: the
// counts need no exchange); rank r computes experts [r E/R, (r+1) E/R) of every MoE layer and the
// rows are combined with one all-gather per MoE layer call, after which each rank sums each
// token's slots in slot order exactly as one process does, so the logits are bitwise the
// single-process ones. The trunk is replicated rather than run on rank 0 with the hidden states
// broadcast: decoding is latency-bound and the trunk is small next to the experts, so every
// rank computing it costs no extra time and saves a broadcast per layer.
#pragma once
#include <vector>

#include "dist/comm.h"
#include "kernels/moe_exchange.h"

namespace k3::dist {

class CommExpertExchange : public ExpertExchange {
 public:
  explicit CommExpertExchange(Comm& comm) : comm_(comm) {}
  bool owns(int64_t e, int64_t E) const override;
  void exchange(float* slots, const MoEDispatch& dp, int64_t Tn, int64_t k, int64_t E, int64_t n_in) override;

 private:
  Comm& comm_;
  std::vector<float> stage_;
  std::vector<int64_t> counts_, displs_;
};

}  // namespace k3::dist
