// The bucketed, rank-ordered reduce-scatter (see ordered_reduction.h).
#include "dist/ordered_reduction.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace k3::dist {

template <typename T>
BucketedReduceScatter<T>::BucketedReduceScatter(Comm& comm, T* g, int64_t n, const std::vector<int64_t>& bounds,
                                                int64_t bucket, int max_inflight, std::string label)
    : comm_(comm), g_(g), n_(n), B_(std::max<int64_t>(1, bucket)), bounds_(bounds), cap_(std::max(1, max_inflight)),
      label_(std::move(label)) {
  const int N = comm_.size();
  K3_ASSERT(int(bounds_.size()) == N + 1 && bounds_[0] == 0 && bounds_[size_t(N)] == n, label_ + ": bounds");
  if (N == 1) return;  // nothing to exchange: g is already the sum
  nbuckets_ = (n + B_ - 1) / B_;
  final_elems_.assign(size_t(nbuckets_), 0);
  state_.assign(size_t(nbuckets_), kWaiting);
}

template <typename T>
void BucketedReduceScatter<T>::post(int64_t k) {
  const int N = comm_.size(), me = comm_.rank();
  const size_t nr = size_t(N);
  const int64_t b0 = k * B_, b1 = std::min(n_, b0 + B_), es = int64_t(sizeof(T));
  std::vector<int64_t> sc(nr), sd(nr), rc(nr), rd(nr);
  for (int p = 0; p < N; ++p) {
    const int64_t lo = std::clamp(bounds_[size_t(p)], b0, b1), hi = std::clamp(bounds_[size_t(p) + 1], b0, b1);
    sc[size_t(p)] = (hi - lo) * es, sd[size_t(p)] = (lo - b0) * es;
  }
  Slot& s = inflight_.emplace_back();
  s.m0 = std::clamp(bounds_[size_t(me)], b0, b1), s.m1 = std::clamp(bounds_[size_t(me) + 1], b0, b1);
  const int64_t m = s.m1 - s.m0;
  s.recv.resize(size_t(N * m));
  for (int q = 0; q < N; ++q) rc[size_t(q)] = m * es, rd[size_t(q)] = q * m * es;
  s.req = comm_.ialltoallv(g_ + b0, sc.data(), sd.data(), s.recv.data(), rc.data(), rd.data(), label_);
  state_[size_t(k)] = kPosted;
  if (!finishing_) ++early_;
}

// The owner's sum of one bucket, in rank order (the only float operations of the reduction).
template <typename T>
void BucketedReduceScatter<T>::sum(const Slot& s) {
  const int N = comm_.size();
  const int64_t m = s.m1 - s.m0;
  T* out = g_ + s.m0;
  const T* r0 = s.recv.data();
  for (int64_t i = 0; i < m; ++i) {
    T a = r0[i];
    for (int q = 1; q < N; ++q) a += r0[size_t(q) * size_t(m) + size_t(i)];
    out[i] = a;
  }
}

template <typename T>
void BucketedReduceScatter<T>::post_queued() {
  while (!queue_.empty() && int(inflight_.size()) < cap_) {
    post(queue_.front());
    queue_.pop_front();
  }
}

template <typename T>
void BucketedReduceScatter<T>::ready(int64_t lo, int64_t hi) {
  K3_ASSERT(!finishing_, label_ + ": ready() after finish()");
  K3_ASSERT(0 <= lo && lo <= hi && hi <= n_, label_ + ": a ready range outside the buffer");
  if (lo == hi || nbuckets_ == 0) return;
  // Each element is reported once: the range may not overlap one given before.
  auto next = reported_.upper_bound(lo);
  K3_ASSERT(next == reported_.end() || next->first >= hi, label_ + ": a ready range reported twice");
  K3_ASSERT(next == reported_.begin() || std::prev(next)->second <= lo, label_ + ": a ready range reported twice");
  reported_.emplace(lo, hi);
  for (int64_t k = lo / B_; k <= (hi - 1) / B_; ++k) {
    const int64_t b0 = k * B_, b1 = std::min(n_, b0 + B_);
    final_elems_[size_t(k)] += std::min(hi, b1) - std::max(lo, b0);
    if (final_elems_[size_t(k)] == b1 - b0) queue_.push_back(k), state_[size_t(k)] = kQueued;
  }
  post_queued();
}

template <typename T>
void BucketedReduceScatter<T>::poll() {
  for (auto it = inflight_.begin(); it != inflight_.end();) {
    if (comm_.test(it->req)) {
      sum(*it);
      it = inflight_.erase(it);
    } else {
      ++it;
    }
  }
  post_queued();
}

template <typename T>
void BucketedReduceScatter<T>::finish() {
  if (finishing_) return;
  finishing_ = true;
  // The rest after the queue: every bucket not yet final, ascending.
  for (int64_t k = 0; k < nbuckets_; ++k)
    if (state_[size_t(k)] == kWaiting) queue_.push_back(k), state_[size_t(k)] = kQueued;
  for (;;) {
    post_queued();
    if (inflight_.empty()) break;
    Slot& s = inflight_.front();  // the oldest: cap_ reached, or the queue is empty
    if (s.req) comm_.wait(s.req);
    sum(s);
    inflight_.pop_front();
  }
}

template class BucketedReduceScatter<float>;
template class BucketedReduceScatter<int64_t>;

}  // namespace k3::dist
