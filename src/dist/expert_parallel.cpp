// Expert parallelism at inference (see expert_parallel.h).
#include "dist/expert_parallel.h"

#include <cstring>

#include "core/error.h"

namespace k3::dist {

bool CommExpertExchange::owns(int64_t e, int64_t E) const {
  const int64_t n_ranks = comm_.size();
  K3_ASSERT(E % n_ranks == 0, "expert parallelism: the expert count must be a multiple of the ranks");
  return e / (E / n_ranks) == comm_.rank();
}

// Rows travel in dispatch order (expert, then token): rank r's are positions
// [offset[r E/n_ranks], offset[(r+1) E/n_ranks]) of the dispatch, one contiguous block per rank.
void CommExpertExchange::exchange(float* slots, const MoEDispatch& dp, int64_t Tn, int64_t k, int64_t E,
                                  int64_t n_in) {
  const int n_ranks = comm_.size(), me = comm_.rank();
  const int64_t per = E / n_ranks;
  counts_.assign(size_t(n_ranks), 0);
  displs_.assign(size_t(n_ranks), 0);
  for (int r = 0; r < n_ranks; ++r) {
    const int64_t p0 = dp.offset[size_t(r * per)], p1 = dp.offset[size_t((r + 1) * per)];
    counts_[size_t(r)] = (p1 - p0) * n_in * int64_t(sizeof(float));
    displs_[size_t(r)] = p0 * n_in * int64_t(sizeof(float));
  }
  stage_.resize(size_t(Tn * k * n_in));
  const int64_t m0 = dp.offset[size_t(me * per)], m1 = dp.offset[size_t((me + 1) * per)];
  for (int64_t p = m0; p < m1; ++p)
    std::memcpy(stage_.data() + p * n_in, slots + dp.slot[size_t(p)] * n_in, sizeof(float) * size_t(n_in));
  comm_.allgatherv(stage_.data() + m0 * n_in, stage_.data(), counts_.data(), displs_.data(), "ep.combine");
  for (int64_t p = 0; p < Tn * k; ++p)
    if (p < m0 || p >= m1)
      std::memcpy(slots + dp.slot[size_t(p)] * n_in, stage_.data() + p * n_in, sizeof(float) * size_t(n_in));
}

}  // namespace k3::dist
