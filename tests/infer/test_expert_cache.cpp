// Expert cache policies (infer/expert_cache.h) on synthetic access traces: exact LRU and
// S3-FIFO behaviour where it is known (a loop one larger than the cache gives LRU no hit at
// all; a working set that fits gives both the same hits), S3-FIFO keeping a reused set
// through one-time scans where LRU loses it, flat (uniform) routing giving both about
// capacity / keys (what the planner assumes), and pinned slots never evicted.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/error.h"
#include "infer/expert_cache.h"

using namespace k3;

namespace {

double hit_rate(CachePolicy p, int64_t capacity, int64_t n_keys, const std::vector<int64_t>& trace) {
  ExpertCacheIndex c(capacity, p, n_keys);
  int64_t hits = 0;
  for (int64_t k : trace) hits += c.access(k) ? 1 : 0;
  EXPECT_EQ(c.hits, hits);
  EXPECT_EQ(c.hits + c.misses, int64_t(trace.size()));
  EXPECT_LE(c.size(), capacity);
  return double(hits) / double(trace.size());
}

}  // namespace

TEST(ExpertCache, LoopOneLargerThanTheCacheGivesLruNoHit) {
  const int64_t C = 20;
  std::vector<int64_t> trace;
  for (int rep = 0; rep < 50; ++rep)
    for (int64_t k = 0; k <= C; ++k) trace.push_back(k);
  EXPECT_EQ(hit_rate(CachePolicy::LRU, C, C + 1, trace), 0.0);
  // S3-FIFO keeps most of the loop in its main queue.
  EXPECT_GT(hit_rate(CachePolicy::S3FIFO, C, C + 1, trace), 0.5);
}

TEST(ExpertCache, WorkingSetThatFitsHitsAfterItsFirstUse) {
  const int64_t C = 16, N = 16;
  std::mt19937 rng(1);
  std::vector<int64_t> trace;
  for (int i = 0; i < 1000; ++i) trace.push_back(int64_t(rng() % N));
  int64_t distinct = 0;
  std::vector<bool> seen(N, false);
  for (int64_t k : trace) distinct += seen[size_t(k)] ? 0 : 1, seen[size_t(k)] = true;
  const double want = double(trace.size() - size_t(distinct)) / double(trace.size());
  EXPECT_DOUBLE_EQ(hit_rate(CachePolicy::LRU, C, N, trace), want);
  EXPECT_DOUBLE_EQ(hit_rate(CachePolicy::S3FIFO, C, N, trace), want);
}

TEST(ExpertCache, S3FifoKeepsAReusedSetThroughScans) {
  // A hot set of 32 keys used again and again, each use followed by 4 keys never seen again
  // (flat routing touches many experts once): the cache holds 64.
  const int64_t C = 64, hot = 32;
  std::mt19937 rng(7);
  std::vector<int64_t> trace;
  int64_t fresh = hot;
  for (int i = 0; i < 20000; ++i) {
    trace.push_back(int64_t(rng() % hot));
    for (int j = 0; j < 4; ++j) trace.push_back(fresh++);
  }
  const double lru = hit_rate(CachePolicy::LRU, C, fresh, trace);
  const double s3 = hit_rate(CachePolicy::S3FIFO, C, fresh, trace);
  // Every hot key is used once in 32 uses = 160 accesses on average: LRU's 64 slots keep it
  // only when it comes back within 64 accesses; S3-FIFO keeps the whole hot set in main.
  EXPECT_GT(s3, 0.19);  // at most 0.2 (the hot fifth of the trace)
  EXPECT_LT(lru, 0.12);
  EXPECT_GT(s3, lru + 0.07);
}

TEST(ExpertCache, FlatRoutingHitsAboutCapacityOverKeys) {
  const int64_t C = 100, N = 1000;
  std::mt19937 rng(3);
  std::vector<int64_t> trace;
  for (int i = 0; i < 200000; ++i) trace.push_back(int64_t(rng() % N));
  EXPECT_NEAR(hit_rate(CachePolicy::LRU, C, N, trace), 0.1, 0.01);
  EXPECT_NEAR(hit_rate(CachePolicy::S3FIFO, C, N, trace), 0.1, 0.01);
}

TEST(ExpertCache, PinnedSlotsAreNeverEvicted) {
  for (CachePolicy p : {CachePolicy::LRU, CachePolicy::S3FIFO}) {
    ExpertCacheIndex c(4, p, 100);
    std::vector<int64_t> slot(3);
    for (int64_t k = 0; k < 3; ++k) {
      slot[size_t(k)] = c.insert(k);
      ASSERT_GE(slot[size_t(k)], 0);
      c.pin(slot[size_t(k)]);
    }
    for (int64_t k = 3; k < 100; ++k) ASSERT_GE(c.insert(k), 0) << cache_policy_name(p);
    for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(c.key_of(slot[size_t(k)]), k) << cache_policy_name(p);
    EXPECT_EQ(c.find(99), c.find(99));  // the last key took the one free slot
    // Every slot pinned: no room, nothing changes.
    const int64_t s99 = c.find(99);
    c.pin(s99);
    EXPECT_EQ(c.insert(50), -1);
    EXPECT_EQ(c.key_of(s99), 99);
    c.unpin(s99);
    EXPECT_GE(c.insert(50), 0);
    EXPECT_EQ(c.find(99), -1);
  }
}

TEST(ExpertCache, EraseFreesTheSlotAndUnknownPolicyIsAnError) {
  ExpertCacheIndex c(2, CachePolicy::S3FIFO, 10);
  const int64_t s = c.insert(3);
  c.erase(3);
  EXPECT_EQ(c.find(3), -1);
  EXPECT_EQ(c.size(), 0);
  EXPECT_EQ(c.insert(4), s);
  EXPECT_THROW(parse_cache_policy("lfu"), Error);
  EXPECT_EQ(parse_cache_policy("lru"), CachePolicy::LRU);
}
