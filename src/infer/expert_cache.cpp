// Expert cache index: LRU and S3-FIFO over pinnable slots (see expert_cache.h).
#include "infer/expert_cache.h"

#include <algorithm>

#include "core/error.h"

namespace k3 {

CachePolicy parse_cache_policy(const std::string& s) {
  if (s == "lru") return CachePolicy::LRU;
  if (s == "s3fifo") return CachePolicy::S3FIFO;
  fail("--cache-policy: expected lru or s3fifo, got '" + s + "'");
}

const char* cache_policy_name(CachePolicy p) { return p == CachePolicy::LRU ? "lru" : "s3fifo"; }

ExpertCacheIndex::ExpertCacheIndex(int64_t capacity, CachePolicy policy, int64_t n_keys)
    : capacity_(capacity), policy_(policy) {
  K3_ASSERT(capacity >= 1 && n_keys >= 1, "expert cache: capacity and key count must be positive");
  key_slot_.assign(size_t(n_keys), -1);
  slot_key_.assign(size_t(capacity), -1);
  pins_.assign(size_t(capacity), 0);
  for (int64_t s = capacity - 1; s >= 0; --s) free_.push_back(int32_t(s));
  prev_.assign(size_t(capacity), -1);
  next_.assign(size_t(capacity), -1);
  freq_.assign(size_t(capacity), 0);
  in_small_.assign(size_t(capacity), 0);
  ghost_stamp_.assign(size_t(n_keys), 0);
  small_target_ = std::max<int64_t>(1, capacity / 10);
  ghost_cap_ = std::max<int64_t>(1, capacity - small_target_);
}

void ExpertCacheIndex::lru_unlink(int64_t s) {
  const int32_t p = prev_[size_t(s)], n = next_[size_t(s)];
  if (p >= 0) next_[size_t(p)] = n;
  else head_ = n;
  if (n >= 0) prev_[size_t(n)] = p;
  else tail_ = p;
  prev_[size_t(s)] = next_[size_t(s)] = -1;
}

void ExpertCacheIndex::lru_touch(int64_t s) {  // s must be unlinked
  prev_[size_t(s)] = -1;
  next_[size_t(s)] = head_;
  if (head_ >= 0) prev_[size_t(head_)] = int32_t(s);
  head_ = int32_t(s);
  if (tail_ < 0) tail_ = int32_t(s);
}

int64_t ExpertCacheIndex::find(int64_t key) {
  const int64_t s = key_slot_.at(size_t(key));
  if (s < 0) {
    ++misses;
    return -1;
  }
  ++hits;
  if (policy_ == CachePolicy::LRU) {
    lru_unlink(s);
    lru_touch(s);
  } else {
    freq_[size_t(s)] = uint8_t(std::min(3, freq_[size_t(s)] + 1));
  }
  return s;
}

int64_t ExpertCacheIndex::evict() {
  if (n_pinned_ >= capacity_) return -1;
  int64_t victim = -1;
  if (policy_ == CachePolicy::LRU) {
    for (int32_t s = tail_; s >= 0; s = prev_[size_t(s)])
      if (pins_[size_t(s)] == 0) {
        victim = s;
        break;
      }
    K3_ASSERT(victim >= 0, "expert cache: no unpinned entry to evict");
    lru_unlink(victim);
  } else {
    // Every entry's frequency drops by one per pass over main, so a few passes always find one.
    // The rule picks the queue; a pass that finds nothing (all pinned, or promoted / given a
    // second chance) tries the other queue next.
    bool from_small = !small_.empty() && (int64_t(small_.size()) >= small_target_ || main_.empty());
    for (int round = 0; round < 16 && victim < 0; ++round, from_small = !from_small) {
      std::deque<int32_t>& q = from_small ? small_ : main_;
      for (size_t i = 0, n = q.size(); i < n && victim < 0; ++i) {
        const int32_t s = q.front();
        q.pop_front();
        if (pins_[size_t(s)] > 0) {
          q.push_back(s);
          continue;
        }
        if (from_small) {
          if (freq_[size_t(s)] > 0) {  // used again while new: promote
            freq_[size_t(s)] = 0;
            in_small_[size_t(s)] = 0;
            main_.push_back(s);
            continue;
          }
          const int64_t key = slot_key_[size_t(s)];  // evicted unused: remember it in the ghost
          ghost_stamp_[size_t(key)] = ++stamp_;
          ghost_.emplace_back(key, stamp_);
          while (int64_t(ghost_.size()) > ghost_cap_) {
            const auto [gk, gs] = ghost_.front();
            ghost_.pop_front();
            if (ghost_stamp_[size_t(gk)] == gs) ghost_stamp_[size_t(gk)] = 0;
          }
          victim = s;
        } else {
          if (freq_[size_t(s)] > 0) {
            --freq_[size_t(s)];
            main_.push_back(s);
            continue;
          }
          victim = s;
        }
      }
    }
    K3_ASSERT(victim >= 0, "expert cache: no unpinned entry to evict");
  }
  key_slot_[size_t(slot_key_[size_t(victim)])] = -1;
  slot_key_[size_t(victim)] = -1;
  ++evictions;
  return victim;
}

int64_t ExpertCacheIndex::insert(int64_t key) {
  K3_ASSERT(key_slot_.at(size_t(key)) < 0, "expert cache: key inserted twice");
  int64_t s;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    s = evict();
    if (s < 0) return -1;
  }
  key_slot_[size_t(key)] = int32_t(s);
  slot_key_[size_t(s)] = key;
  freq_[size_t(s)] = 0;
  if (policy_ == CachePolicy::LRU) {
    lru_touch(s);
  } else if (ghost_stamp_[size_t(key)] != 0) {  // seen recently: straight to main
    ghost_stamp_[size_t(key)] = 0;
    in_small_[size_t(s)] = 0;
    main_.push_back(int32_t(s));
  } else {
    in_small_[size_t(s)] = 1;
    small_.push_back(int32_t(s));
  }
  return s;
}

void ExpertCacheIndex::erase(int64_t key) {
  const int64_t s = key_slot_.at(size_t(key));
  if (s < 0) return;
  K3_ASSERT(pins_[size_t(s)] == 0, "expert cache: erasing a pinned entry");
  if (policy_ == CachePolicy::LRU) {
    lru_unlink(s);
  } else {
    std::deque<int32_t>& q = in_small_[size_t(s)] ? small_ : main_;
    q.erase(std::find(q.begin(), q.end(), int32_t(s)));
  }
  key_slot_[size_t(key)] = -1;
  slot_key_[size_t(s)] = -1;
  free_.push_back(int32_t(s));
}

void ExpertCacheIndex::pin(int64_t s) {
  if (pins_[size_t(s)]++ == 0) ++n_pinned_;
}

void ExpertCacheIndex::unpin(int64_t s) {
  K3_ASSERT(pins_[size_t(s)] > 0, "expert cache: unpinning an unpinned slot");
  if (--pins_[size_t(s)] == 0) --n_pinned_;
}

bool ExpertCacheIndex::access(int64_t key) {
  if (find(key) >= 0) return true;
  insert(key);
  return false;
}

}  // namespace k3
