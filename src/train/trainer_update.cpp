// The parameter update of a training step (see trainer_impl.h): the global gradient norm and
// clipping, the stage's warmup-stable-decay learning rate, the optimiser over this rank's
// parameters, and (ZeRO-1) the owners' updated parameters gathered on every rank.
#include <cmath>

#include "train/trainer_impl.h"

namespace k3 {

void Trainer::Impl::update_parameters(TrainStep& s) {
  s.t1 = trainer_detail::Clock::now();
  // The norm is the square root of per-parameter sums of squares added in parameter order,
  // so ranks that own disjoint parameters compute the one process's double.
  if (ep) {  // every parameter's squared norm in parameter order: the experts' from their owners
    const std::vector<double> mine_sq = param_sq_norms(optim->params());
    std::vector<double> local_sq(all_refs.size(), 0.0);
    for (size_t j = 0; j < local_refs.size(); ++j) local_sq[local_refs[j]] = mine_sq[j];
    s.gnorm = norm_of_sq_norms(shard.assemble<double>(
        *dp, all_refs.size(), [](size_t) { return size_t(1); }, [&](size_t i) { return &local_sq[i]; }, "grad.norm"));
    clip_grads_to(optim->params(), s.gnorm, run.grad_clip);
  } else if (zero) {  // each rank holds the summed gradients of its own parameters only
    const std::vector<double> sq = param_sq_norms(optim->params());
    s.gnorm = norm_of_sq_norms(dp->allgatherv(sq.data(), sq.size(), "grad.norm"));
    clip_grads_to(optim->params(), s.gnorm, run.grad_clip);
  } else {
    s.gnorm = clip_grad_norm(optim->params(), run.grad_clip);
  }
  const StageConfig& sc = *s.stage;
  const int64_t nsteps = steps_of[size_t(st.stage)];
  s.lr = wsd_lr(st.stage_step, nsteps, sc.lr_peak, sc.lr_end, sc.warmup_steps,
                std::llround(sc.decay_frac * double(nsteps)));
  optim->step(s.lr);
  if (zero && ep) {  // the trunk's owners' updates to every rank (packed: no expert range is touched)
    shard.pack(model->weights().data(), trunk_buf.data());
    dp->allgather_ranges(trunk_buf.data(), shard.trunk_bounds, "param.allgather");
    shard.unpack(trunk_buf.data(), model->weights().data());
  } else if (zero) {
    dp->allgather_ranges(model->weights().data(), bounds, "param.allgather");
  }
}

}  // namespace k3
