// One optimiser step of a training run (see trainer.h for what a step is, trainer_impl.h for
// the files of its stages). The stages, in order; each reads and fills the step's TrainStep:
//   1. plan          sequence length, micro-batches, this rank's sequences, the loss scale;
//                    the step's image-text examples; every gradient buffer zeroed
//   2. batch         per micro-batch: its sequences from the stage's stream (long-range tasks
//                    mixed in)
//   3. fwd + bwd     per micro-batch: forward and backward of this rank's sequences (threads
//                    or one at a time), then the image-text examples; their routing observed
//                    by the balancer in sequence order
//   4. reduce        gradients summed over threads, then over data-parallel ranks in rank
//                    order (possibly started during the last backward)
//   5. losses        the global batch's losses summed in one process's order; the balancer's
//                    statistics made the global batch's
//   6. update        clipping, learning rate, optimiser (ZeRO-1: own shard, then gathered);
//                    the balancer's next biases
//   7. record        the run's counters, the metrics record and the progress line
// The order is what makes a run deterministic for a given thread count, a resumed run bitwise
// the run that never stopped, and N data-parallel ranks bitwise one process of N threads.
#include "train/trainer_impl.h"

namespace k3 {

StepStats Trainer::Impl::train_step() {
  TrainStep s = plan_step();
  zero_gradients();
  for (int64_t mb = 0; mb < s.nmicro; ++mb) {
    assemble_micro_batch(s, mb);
    forward_backward_micro_batch(s, mb);
    observe_routing(s);
  }
  s.t_fb = trainer_detail::seconds_since(s.t0);
  reduce_gradients(s);
  gather_losses(s);
  reduce_routing_statistics();
  update_parameters(s);
  update_balancer();
  return record_step(s);
}

}  // namespace k3
