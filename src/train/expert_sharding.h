// Expert-parallel training's view of the parameters (train/parallel.h ExpertParallelTraining;
// used by the trainer, trainer_impl.h). Which optimiser parameters are routed experts and which rank of a
// group owns each; the ranges of the flat gradient buffer that are not routed experts (the
// trunk: reduced over every rank as in data parallelism); and per-parameter quantities
// (weights, gradients, squared norms, optimiser moments) put together in parameter order
// from the ranks that hold them: the trunk's from this rank (every rank holds it) or, under
// ZeRO-1, from its owner; each expert's from its owner in group 0 (world rank = its group
// rank there).
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "train/optimizer.h"
#include "train/parallel.h"

namespace k3 {

// The routed expert index of a parameter name "...block_sparse_moe.experts.<e>.w<1|2|3>.weight",
// else -1.
int64_t routed_expert_index(const std::string& name);

struct ExpertSharding {
  int group_size = 1, group_rank = 0, group = 0, world_rank = 0;
  std::vector<int> owner;   // per parameter (optimiser order): -1 trunk, else the owning group rank
  // per parameter: the world rank whose copy is gathered (an expert's owner in group 0, a
  // trunk parameter's ZeRO-1 owner), or -1 where every rank holds it (the replicated trunk).
  std::vector<int> holder;
  std::vector<std::pair<int64_t, int64_t>> trunk;  // [begin, end) of the flat buffer outside routed experts
  int64_t trunk_elems = 0;
  // The ranks' owned ranges of the packed trunk [world ranks + 1] (whole parameters under
  // ZeRO-1, else an even split): the reduce-scatter's bounds.
  std::vector<int64_t> trunk_bounds;

  // refs: every optimiser parameter (in order) with g pointing into the flat buffer g0 of
  // `total` floats; E experts per MoE layer (a multiple of group_size); world ranks, this one.
  void build(const std::vector<ParamRef>& refs, const float* g0, int64_t total, int64_t E, int gsize, int grank, int grp,
             int world);
  // ZeRO-1 of the trunk: trunk parameter t (t-th of the owner < 0 ones, in order) is held by
  // the world rank r with cut[r] <= t < cut[r + 1] (cut from partition_params).
  void shard_trunk(const std::vector<ParamRef>& refs, const float* g0, const std::vector<size_t>& cut);
  // Whether this rank steps parameter i: its own experts, and the trunk (all of it, or under
  // ZeRO-1 what it holds).
  bool mine(size_t i) const {
    return owner[i] < 0 ? holder[i] < 0 || holder[i] == world_rank : owner[i] == group_rank;
  }
  int64_t packed_offset(int64_t flat) const;      // a flat offset in the trunk -> its offset in the packed trunk
  void pack(const float* g, float* out) const;    // trunk ranges of g -> out [trunk_elems]
  void unpack(const float* in, float* g) const;   // and back

  // Per parameter i of n, values of count(i) elements: this rank's local(i) where it holds
  // them. Returns every parameter's, concatenated in parameter order (collective over dp), on
  // every rank, or (root >= 0) on that rank only (the others get nothing back).
  template <typename T, typename Count, typename Local>
  // sent (optional) runs once this rank's values are sent: it may free them if no parameter
  // is held by every rank (holder < 0), the only ones local() is asked for afterwards.
  std::vector<T> assemble(DataParallel& dp, size_t n, Count count, Local local, const char* label, int root = -1,
                          const std::function<void()>& sent = {}) const {
    // One copy of what this rank holds, the gathered bytes, the result: no more (the
    // optimiser state at a checkpoint is the largest thing gathered).
    // What this rank holds is sent from where it lies when it lies there in order (the
    // optimiser state of a rank holding all it steps), else from a packed copy.
    std::vector<T> mine_v;
    size_t total = 0, held = 0;
    const T* first = nullptr;
    bool in_place = true;
    for (size_t i = 0; i < n; ++i) {
      total += count(i);
      if (holder[i] != world_rank) continue;
      const T* p = local(i);
      if (!first) first = p;
      in_place = in_place && p == first + held;
      held += count(i);
    }
    if (!in_place)
      for (size_t i = 0; i < n; ++i)
        if (holder[i] == world_rank) {
          const T* p = local(i);
          mine_v.insert(mine_v.end(), p, p + count(i));
        }
    const T* send = in_place ? first : mine_v.data();
    std::vector<size_t> counts;
    std::vector<unsigned char> raw;
    if (root < 0) dp.allgatherv_bytes(send, held * sizeof(T), raw, &counts, label);
    else dp.gatherv_bytes(send, held * sizeof(T), root, raw, &counts, label);
    std::vector<T>().swap(mine_v);
    if (sent) sent();
    std::vector<T> out;
    if (root >= 0 && root != world_rank) return out;
    std::vector<size_t> cursor(counts.size(), 0);  // bytes
    for (size_t r = 1; r < counts.size(); ++r) cursor[r] = cursor[r - 1] + counts[r - 1];
    out.resize(total);
    T* o = out.data();
    for (size_t i = 0; i < n; ++i) {
      const size_t c = count(i);
      if (holder[i] < 0) {
        std::memcpy(o, local(i), c * sizeof(T));
      } else {
        size_t& at = cursor[size_t(holder[i])];
        std::memcpy(o, raw.data() + at, c * sizeof(T));
        at += c * sizeof(T);
      }
      o += c;
    }
    return out;
  }
};

}  // namespace k3
