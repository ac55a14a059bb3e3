// Long-range tasks mixed into a training stage (issue 16; docs/model.md section 13: K3's later
// stages train on synthetic tasks whose evidence is spread over the whole window). A stage's
// "long_tasks" replaces a fraction of its sequences by generated samples (train/long_tasks.h)
// of exactly the stage's length; the loss stays the plain next-token loss over every target,
// answers included. Which sequences are replaced, and by what, depends only on the run seed,
// the step and the sequence's index in the global batch, so exact resume needs no new state
// and any split of the batch (threads, data-parallel ranks) sees the same data.
#pragma once
#include <cstdint>
#include <vector>

#include "train/long_tasks.h"

namespace k3 {

struct LongTaskMix {
  double fraction = 0;          // share of the stage's sequences replaced (0: off)
  std::vector<LongTask> tasks;  // drawn uniformly per replaced sequence
  int64_t pairs = 8;            // MQAR / mixed key-value pairs
  int64_t queries = 4;          // MQAR / mixed pairs asked
  int64_t hops = 4;             // vartrack hops (mixed: half, at least 1)
  // Loss weight of a task sample's answer targets (its other targets weigh 1): the filler
  // around a passkey is predictable, so at weight 1 its few answer tokens carry ~2 % of the
  // sample's loss (docs/long-context.md: no model of the first study learnt retrieval).
  double answer_weight = 1;
  // Task lengths (targets, each in [1, the stage's seq_len]; empty: the stage's seq_len): a
  // replaced sequence draws one, L, and holds a sample of L + 1 tokens at its start, the
  // stream's text after it. Varies the span a retrieval must cross and the number of keys
  // the attention sees at the question, so the NoPE MLA layer cannot fit one window length
  // (docs/long-context.md, study 3).
  std::vector<int64_t> lengths;
  // Evidence depth drawn as u^depth_power, u uniform on [0, 1]: 1 spreads it evenly; above 1
  // puts more needles near the start, which the weaker runs of study 3 lose first
  // (docs/long-context.md, study 5). Mean depth 1 / (depth_power + 1).
  double depth_power = 1;
  bool active() const { return fraction > 0 && !tasks.empty(); }
};

// Whether sequence `index` of step `step` is replaced; if so writes the sample into `out`
// and returns true: T + 1 ids (its last answer ends at the last target), or with `lengths`
// the first L + 1 ids for the drawn L, leaving out[L + 1 ..] as the caller's (the stream's
// text). weight (optional, [T] target weights): set to 1, and to mix.answer_weight at the
// targets that predict an answer token of a replaced sequence.
bool mix_long_sample(const LongTaskMix& mix, const TextEncoder& enc, uint64_t seed, int64_t step, int64_t index,
                     int64_t T, int32_t* out, float* weight = nullptr);

// k3::Error (the generator's, naming the task) when a sequence of T + 1 tokens (or of each of
// `lengths` + 1) cannot hold one of the mix's tasks; a no-op for an inactive mix.
void check_long_task_mix(const LongTaskMix& mix, const TextEncoder& enc, int64_t T);

}  // namespace k3
