// Long-range tasks in a training stage (see long_mix.h).
#include "train/long_mix.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace k3 {

namespace {

uint64_t mix64(uint64_t z) {  // splitmix64 finaliser: decorrelates (seed, step, index)
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

LongTaskOptions options_for(const LongTaskMix& mix, LongTask task, int64_t T, uint64_t h) {
  LongTaskOptions o;
  o.task = task;
  o.length = T + 1;
  o.depth = double((h >> 20) % 1001) / 1000.0;
  if (mix.depth_power != 1) o.depth = std::pow(o.depth, mix.depth_power);  // 1: the draw as before, bit for bit
  o.pairs = task == LongTask::vartrack ? mix.hops : mix.pairs;
  o.queries = std::min(mix.queries, o.pairs);
  o.hops = std::max<int64_t>(1, mix.hops / 2);
  o.seed = mix64(h + 1);
  return o;
}

}  // namespace

void check_long_task_mix(const LongTaskMix& mix, const TextEncoder& enc, int64_t T) {
  if (!mix.active()) return;
  std::vector<int64_t> lengths = mix.lengths;
  if (lengths.empty()) lengths.push_back(T);
  for (int64_t L : lengths) {
    if (L < 1 || L > T)
      throw Error("task length " + std::to_string(L) + " is outside [1, seq_len " + std::to_string(T) + "]");
    try {
      for (LongTask t : mix.tasks)
        for (uint64_t seed = 0; seed < 4; ++seed) make_long_sample(enc, options_for(mix, t, L, mix64(seed)));
    } catch (const Error& e) {
      if (mix.lengths.empty()) throw;
      throw Error("lengths entry " + std::to_string(L) + ": " + e.what());
    }
  }
}

bool mix_long_sample(const LongTaskMix& mix, const TextEncoder& enc, uint64_t seed, int64_t step, int64_t index,
                     int64_t T, int32_t* out, float* weight) {
  if (weight) std::fill(weight, weight + T, 1.f);
  if (!mix.active()) return false;
  const uint64_t h = mix64(mix64(mix64(seed ^ 0x6c6f6e67ull) + uint64_t(step)) + uint64_t(index));
  if (double(h >> 11) * 0x1.0p-53 >= mix.fraction) return false;
  const uint64_t h2 = mix64(h);
  const LongTask task = mix.tasks[size_t(h2 % mix.tasks.size())];
  // The task's length: its own hash, so a mix without `lengths` draws exactly as before.
  const int64_t L = mix.lengths.empty() ? T : mix.lengths[size_t(mix64(h2 ^ 0x6c656e73ull) % mix.lengths.size())];
  // With a BPE vocabulary a sample's fixed text varies a little with its random keys; a draw
  // that does not fit (the stage was checked to hold most) is redrawn, deterministically.
  LongSample s;
  for (uint64_t attempt = 0;; ++attempt) {
    try {
      s = make_long_sample(enc, options_for(mix, task, L, h2 + attempt * 0x9e3779b97f4a7c15ull));
      break;
    } catch (const Error&) {
      if (attempt == 7) throw;
    }
  }
  // The generators hit the length exactly; keep the contract even if an encoder merges
  // across piece boundaries: trim the head's first ids or pad them with the first id.
  const int64_t n = int64_t(s.ids.size()), skip = std::max<int64_t>(0, n - (L + 1));
  const int64_t pad = std::max<int64_t>(0, (L + 1) - n);
  std::fill(out, out + pad, s.ids.front());
  std::copy(s.ids.begin() + skip, s.ids.end(), out + pad);
  // Answer id at sample index p sits at out[p - skip + pad], predicted by target p - skip + pad - 1.
  if (weight)
    for (const LongQuery& q : s.queries)
      for (size_t j = 0; j < q.answer.size(); ++j) {
        const int64_t t = q.at + int64_t(j) - skip + pad - 1;
        if (t >= 0 && t < L) weight[t] = float(mix.answer_weight);
      }
  return true;
}

}  // namespace k3
