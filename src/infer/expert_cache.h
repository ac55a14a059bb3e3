// The expert cache's index: which routed experts (keys: moe layer x E + expert) hold which of
// `capacity` slots, under a replacement policy. Pure bookkeeping, no memory and no I/O (the
// slots' bytes live in infer/weight_stream.h's arena), so the policies are unit-tested on
// synthetic access traces (tests/infer/test_expert_cache.cpp).
//
// Policies:
//  LRU     evict the least recently used unpinned entry.
//  S3FIFO  (Yang et al., SOSP 2023) a small FIFO (10 % of the slots) for new entries, a main
//          FIFO for entries seen again, and a ghost FIFO of recently evicted keys (as many as
//          the main FIFO holds): a key evicted from the small FIFO unused goes to the ghost; a
//          miss on a ghost key enters main directly; main entries carry a 2-bit frequency and
//          are reinserted (frequency - 1) instead of evicted while it is non-zero. One-hit
//          keys (flat routing touches most experts once) therefore never displace the
//          entries that are used again, which LRU lets them do.
// Pinned slots (experts in use by the running MoE call) are never evicted.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace k3 {

enum class CachePolicy { LRU, S3FIFO };
CachePolicy parse_cache_policy(const std::string& s);  // "lru" | "s3fifo"; k3::Error naming --cache-policy
const char* cache_policy_name(CachePolicy p);

class ExpertCacheIndex {
 public:
  ExpertCacheIndex() = default;
  // capacity >= 1 slots over keys [0, n_keys).
  ExpertCacheIndex(int64_t capacity, CachePolicy policy, int64_t n_keys);

  // The slot holding key, or -1; a hit counts as an access (hits / misses are counted here).
  int64_t find(int64_t key);
  // key must be absent: gives it a slot (a free one, else an evicted unpinned entry's) and
  // returns it; -1 (nothing changed) when every slot is pinned.
  int64_t insert(int64_t key);
  void erase(int64_t key);  // forget key (a failed read); its slot becomes free
  void pin(int64_t slot);
  void unpin(int64_t slot);
  int64_t pinned() const { return n_pinned_; }
  bool is_pinned(int64_t slot) const { return pins_[size_t(slot)] > 0; }
  int64_t key_of(int64_t slot) const { return slot_key_[size_t(slot)]; }  // -1: free
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return capacity_ - int64_t(free_.size()); }
  CachePolicy policy() const { return policy_; }

  // Trace replay: find, else insert; true on a hit.
  bool access(int64_t key);

  int64_t hits = 0, misses = 0, evictions = 0;

 private:
  int64_t evict();  // an unpinned victim's slot (removed from the index), -1 if all pinned
  void lru_touch(int64_t slot);
  void lru_unlink(int64_t slot);

  int64_t capacity_ = 0;
  CachePolicy policy_ = CachePolicy::S3FIFO;
  std::vector<int32_t> key_slot_;  // [n_keys] -> slot or -1
  std::vector<int64_t> slot_key_;  // [capacity] -> key or -1
  std::vector<int32_t> pins_;      // [capacity]
  int64_t n_pinned_ = 0;
  std::vector<int32_t> free_;
  // LRU: doubly linked list of slots, head = most recent.
  std::vector<int32_t> prev_, next_;
  int32_t head_ = -1, tail_ = -1;
  // S3-FIFO
  std::deque<int32_t> small_, main_;
  std::vector<uint8_t> freq_, in_small_;
  std::deque<std::pair<int64_t, uint64_t>> ghost_;  // (key, stamp)
  std::vector<uint64_t> ghost_stamp_;               // [n_keys] 0: not in the ghost
  uint64_t stamp_ = 0;
  int64_t small_target_ = 1, ghost_cap_ = 1;
};

}  // namespace k3
