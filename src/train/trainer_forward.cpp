// Forward and backward over one micro-batch of a training step (see trainer_impl.h): this
// rank's text sequences (in parallel, each thread into its own gradient buffer, or one at a
// time), then the image-text examples; the per-sequence losses kept in sequence order.
#include <omp.h>

#include <exception>

#include "core/error.h"
#include "kernels/moe_exchange.h"
#include "train/trainer_impl.h"

namespace k3 {

void trainer_detail::for_each_sequence(int64_t n, int P, bool par, const std::function<void(int64_t, int)>& body) {
  if (!par) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) num_threads(P)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i, omp_get_thread_num());
    } catch (...) {
      err[size_t(i)] = std::current_exception();
    }
  }
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

void Trainer::Impl::forward_backward_micro_batch(TrainStep& s, int64_t mb) {
  using trainer_detail::for_each_sequence;
  const int64_t T = s.T, nl = s.nl;
  {
    // Expert parallel: the MoE layers' training forwards and backwards exchange rows with
    // the experts' owners (kernels/moe_exchange.h) for these sequences only.
    struct ExchangeScope {
      explicit ExchangeScope(ExpertParallelTraining* e) { if (e) set_expert_train_exchange(e->exchange()); }
      ~ExchangeScope() { set_expert_train_exchange(nullptr); }
    } scope(ep);
    // The step's last backward: the reduction starts on each range as the backward finishes
    // it (no other collective runs before it ends, in reduce_gradients).
    if (s.overlap && mb == s.nmicro - 1)
      s.reduction =
          dp->begin_reduce_sum_ordered(grads[0].data<float>(), model->weights().size(), bounds, !zero, "grad.reduce");
    OrderedReduction* reduction = s.reduction.get();
    const GradRangeDone on_done = [reduction](int64_t lo, int64_t hi) {
      reduction->ready(lo, hi);
      reduction->poll();
    };
    for_each_sequence(nl, P, s.par, [&](int64_t q, int tid) {
      LossOptions lo = loss_opt;
      if (s.weighted) lo.target_weight = seq_weights.data() + q * T;
      const GradRangeDone* done = reduction && q == nl - 1 ? &on_done : nullptr;
      K3_ASSERT(!done || tid == 0, "train: an overlapped reduction needs the sequences in one buffer");
      results[size_t(q)] = forward_backward(*model, seqs.data() + q * (T + 1), T, s.scale,
                                            grads[size_t(tid)].data<float>(), *scratch[size_t(tid)], lo,
                                            balancer ? &routing[size_t(q)] : nullptr, done);
    });
  }
  for (int64_t q = 0; q < nl; ++q)
    s.part[size_t(2 * (mb * nl + q))] = results[size_t(q)].loss_sum,
    s.part[size_t(2 * (mb * nl + q) + 1)] = results[size_t(q)].aux_loss;
  if (vision) {
    const auto tv = trainer_detail::Clock::now();
    vrouting.resize(size_t(s.nvis));
    vresults.resize(size_t(s.nvis));
    for_each_sequence(s.nvis, P, P > 1 && s.nvis > 1, [&](int64_t q, int tid) {
      vresults[size_t(q)] = vision->run(*model, mb * s.nvis + q, tid, s.scale, grads[size_t(tid)].data<float>(),
                                        *scratch[size_t(tid)], loss_opt, balancer ? &vrouting[size_t(q)] : nullptr);
    });
    for (int64_t q = 0; q < s.nvis; ++q) s.vloss_sum += vresults[size_t(q)].loss_sum;
    s.t_vis += trainer_detail::seconds_since(tv);
  }
}

}  // namespace k3
