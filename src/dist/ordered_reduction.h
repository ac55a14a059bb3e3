// The fixed-order bucketed reduce-scatter of data_parallel.h as a state machine, so that it can
// start while the values are still being computed (train/parallel.h OrderedReduction).
//
// g[0, n) is cut into buckets of `bucket` elements, [k B, (k + 1) B). For a bucket every rank
// sends each owner, with one all-to-all, the part of the bucket that owner owns; the owner sums
// the N pieces in rank order, ((g_0 + g_1) + g_2) + ..., into its range of g. Buckets are
// independent, so the order in which they travel and are summed changes no bit.
//  - ready(lo, hi): g[lo, hi) is final; every bucket that is now entirely final joins a queue
//    (in the order they become so), and the queue is posted while fewer than max_inflight
//    exchanges are in flight.
//  - poll(): tests every exchange in flight (moving it on: MPI progresses only inside its
//    calls), sums the ones that have arrived, posts from the queue into the freed places.
//  - finish(): posts the queue, then every bucket not yet final in ascending order, keeping at
//    most max_inflight in flight (waiting for the oldest first), and sums every bucket.
// Every rank posts the same buckets in the same order whatever the timing: the queue is
// posted strictly first-in first-out, and what joins it depends only on the ready() calls,
// which are the same on every rank. Fed nothing before finish(), this is the plain
// reduce-scatter (ascending buckets, at most max_inflight in flight).
#pragma once
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace k3::dist {

template <typename T>
class BucketedReduceScatter {
 public:
  // bounds [N + 1]: the ranks' owned ranges (bounds[0] = 0, bounds[N] = n).
  BucketedReduceScatter(Comm& comm, T* g, int64_t n, const std::vector<int64_t>& bounds, int64_t bucket,
                        int max_inflight, std::string label);
  void ready(int64_t lo, int64_t hi);
  void poll();
  void finish();
  int64_t buckets() const { return nbuckets_; }
  int64_t posted_before_finish() const { return early_; }  // buckets posted by ready() / poll()

 private:
  struct Slot {
    int64_t m0 = 0, m1 = 0;  // this rank's owned part of the bucket
    std::vector<T> recv;     // [N, m1 - m0]: every rank's values there, in rank order
    Comm::RequestPtr req;
  };
  void post(int64_t k);
  void sum(const Slot& s);
  void post_queued();

  Comm& comm_;
  T* g_;
  int64_t n_, B_, nbuckets_ = 0, early_ = 0;
  std::vector<int64_t> bounds_;
  int cap_;
  std::string label_;
  bool finishing_ = false;
  std::map<int64_t, int64_t> reported_;  // lo -> hi of the ranges given to ready()
  std::vector<int64_t> final_elems_;     // per bucket: elements reported final
  enum : char { kWaiting, kQueued, kPosted };
  std::vector<char> state_;              // per bucket
  std::deque<int64_t> queue_;            // final buckets not yet posted, in the order they became so
  std::list<Slot> inflight_;             // in posting order
};

}  // namespace k3::dist
