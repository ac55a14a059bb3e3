// A training step's batch (see trainer_impl.h): its plan (sequence length, micro-batches,
// this rank's sequences, the loss scale, which paths the step takes), the zeroed gradient
// buffers, and the sequences of one micro-batch read from the stage's stream, some replaced by
// generated long-range tasks.
#include <cstring>

#include "train/long_mix.h"
#include "train/trainer_impl.h"

namespace k3 {

TrainStep Trainer::Impl::plan_step() {
  TrainStep s;
  s.stage = &run.stages[size_t(st.stage)];
  s.T = s.stage->seq_len;
  s.nseq = run.micro_batch_tokens / s.T;
  s.nmicro = run.batch_tokens / run.micro_batch_tokens;
  // Data parallel: this rank trains sequences [first, first + nl) of every micro-batch; every
  // rank reads the whole micro-batch from the stream, so the stream position stays global.
  s.nl = s.nseq / n_ranks;
  s.first = rank * s.nl;
  s.targets = s.nmicro * s.nseq * s.T;
  s.t0 = trainer_detail::Clock::now();
  // Image-text examples of the whole step, prepared first: their scored targets join the
  // text's in the one mean loss (scale).
  s.nvis = vision ? run.vision.examples_per_micro_batch : 0;
  s.vtargets = vision ? vision->prepare(s.nmicro * s.nvis) : 0;
  s.scale = 1.0 / double(s.targets + s.vtargets);
  s.par = P > 1 && s.nl > 1 && !ep;  // expert parallel: one sequence at a time (MPI from the main thread)
  // The reduction overlaps the last sequence's backward where a rank adds every sequence into
  // one buffer (one thread, or one sequence per micro-batch): only then is a range final when
  // the backward leaves it. With sequences on several threads the buffers are summed after the
  // backward (reduce_gradients), so nothing is final before; the ranks agree (setup) since the
  // reduction's collectives start in another order.
  s.overlap = overlap && (!threaded_rank || s.nl == 1);
  s.weighted = s.stage->long_tasks.active() && s.stage->long_tasks.answer_weight != 1.0;
  s.part.assign(size_t(2 * s.nmicro * s.nl), 0.0);
  // The step's buffers.
  seqs.resize(size_t(s.nl * (s.T + 1)));
  skip_seq.resize(size_t(s.T + 1));
  if (s.weighted) seq_weights.resize(size_t(s.nl * s.T)), skip_weights.resize(size_t(s.T));
  routing.resize(size_t(s.nl));
  results.resize(size_t(s.nl));
  return s;
}

// Every gradient buffer zeroed (each thread its own: first touch stays local); expert
// parallel: the trunk only, the own experts' being zeroed by begin_step and the others' never
// touched.
void Trainer::Impl::zero_gradients() {
  if (vision) vision->zero_grads();
  const int64_t total = model->weights().size();
  if (ep) ep->begin_step();
  if (ep) {
    float* g = grads[0].data<float>();
    for (const auto& [b, e] : shard.trunk) std::memset(g + b, 0, sizeof(float) * size_t(e - b));
  } else {
#pragma omp parallel for schedule(static) num_threads(P)
    for (int t = 0; t < int(grads.size()); ++t) std::memset(grads[size_t(t)].data<float>(), 0, sizeof(float) * size_t(total));
  }
}

// Micro-batch mb's sequences: every rank reads all of them from the stream (the data position
// never depends on the rank count or on the mix), keeping its own [first, first + nl); a
// generated long-range task may replace a sequence (long_mix.h), decided by (seed, step,
// sequence index) alone.
void Trainer::Impl::assemble_micro_batch(TrainStep& s, int64_t mb) {
  const TextEncoder encode = [this](const std::string& text) { return vocab.encode(text); };
  const int64_t T = s.T;
  for (int64_t q = 0; q < s.nseq; ++q) {
    const bool mine = q >= s.first && q < s.first + s.nl;
    int32_t* seq = mine ? seqs.data() + (q - s.first) * (T + 1) : skip_seq.data();
    float* wt = !s.weighted ? nullptr : mine ? seq_weights.data() + (q - s.first) * T : skip_weights.data();
    stream->next(seq);  // advances even when replaced: the data position never depends on the mix
    s.long_seqs += mix_long_sample(s.stage->long_tasks, encode, run.seed, st.step, mb * s.nseq + q, T, seq, wt);
  }
}

}  // namespace k3
