// The reductions of a training step (see trainer_impl.h): the gradients summed over threads,
// then over data-parallel ranks in rank order (docs/distributed.md), so N ranks of P threads
// sum exactly as one process of N P threads; then the losses of the global batch, summed in
// the order one process sums them.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "train/trainer_impl.h"

namespace k3 {

void Trainer::Impl::reduce_gradients(TrainStep& s) {
  const int64_t total = model->weights().size();
  // The per-thread gradients into buffer 0, in thread order (deterministic).
  float* g0 = grads[0].data<float>();
  if (s.par) {
    const int64_t chunk = 1 << 14;
#pragma omp parallel for schedule(static) num_threads(P)
    for (int64_t c0 = 0; c0 < total; c0 += chunk) {
      const int64_t c1 = std::min(total, c0 + chunk);
      for (int t = 1; t < P; ++t) {
        const float* gt = grads[size_t(t)].data<float>();
        for (int64_t i = c0; i < c1; ++i) g0[i] += gt[i];
      }
    }
  }
  if (dp) {
    // The ranks' gradients, summed in rank order (((g_0 + g_1) + g_2) ...), the order in which
    // one process of n_ranks threads sums its thread buffers above; t_reduce is what is left
    // of it after the backward (all of it unless overlapped).
    const auto tr = trainer_detail::Clock::now();
    if (s.reduction) {
      s.reduction->finish();
    } else if (ep) {
      // The trunk as data parallelism reduces it (packed: the routed experts are not in it);
      // the experts on their owners, summed in the same rank order. Under ZeRO-1 only each
      // rank's owned trunk parameters are summed (the rest of the unpacked trunk is left
      // partial: nobody steps it here).
      shard.pack(g0, trunk_buf.data());
      dp->reduce_sum_ordered(trunk_buf.data(), shard.trunk_elems, shard.trunk_bounds, !zero, "grad.reduce");
      shard.unpack(trunk_buf.data(), g0);
      ep->reduce_gradients();
    } else {
      dp->reduce_sum_ordered(g0, total, bounds, !zero, "grad.reduce");
    }
    s.t_reduce = trainer_detail::seconds_since(tr);
  }
  if (vision) {  // the encoder's thread buffers, and its norm before clipping (for the record)
    vision->reduce_grads();
    s.vgnorm = vision->grad_norm();
  }
}

// The step's losses in the order one process sums them: micro-batch, then sequence (the
// ranks' sequences of a micro-batch follow each other in rank order). Gathered after the
// gradient reduction: no collective may start while it runs. A non-finite loss ends the run
// with the last checkpoint kept.
void Trainer::Impl::gather_losses(TrainStep& s) {
  if (dp) s.part = dp->allgatherv(s.part.data(), s.part.size(), "loss.gather");
  for (int64_t mb = 0; mb < s.nmicro; ++mb)
    for (int r = 0; r < n_ranks; ++r)
      for (int64_t q = 0; q < s.nl; ++q) {
        const size_t i = size_t(2 * ((int64_t(r) * s.nmicro + mb) * s.nl + q));
        s.loss_sum += s.part[i], s.aux_sum += s.part[i + 1];
      }
  s.loss = (s.loss_sum + s.vloss_sum) / double(s.targets + s.vtargets);
  if (!std::isfinite(s.loss))
    fail("train: the loss is " + trainer_detail::fmt("%g", s.loss) + " at step " + std::to_string(st.step + 1) +
         " (diverged); the last checkpoint is kept: lower the learning rate and resume or restart");
}

}  // namespace k3
