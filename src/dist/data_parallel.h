// train/parallel.h's DataParallel over a dist::Comm (see comm.h): the algorithms, the same for
// every backend.
//  - reduce_sum_ordered: a bucketed reduce-scatter built from all-to-alls. The buffer is cut
//    into buckets of bucket_bytes; for each bucket every rank sends each owner the part of the
//    bucket the owner owns, and the owner sums the pieces it receives in rank order,
//    ((g_0 + g_1) + g_2) + ..., in float. Up to `inflight` buckets are exchanged while the
//    previous one is summed. With all = true the owned ranges are then all-gathered (the two
//    halves of a ring all-reduce: 2 (N-1)/N of the buffer sent per rank, as the analytic
//    count in docs/distributed.md).
//  - begin_reduce_sum_ordered: the same reduction fed ranges as the backward finishes them
//    (ordered_reduction.h): each bucket's all-to-all starts as soon as the bucket is final,
//    up to `overlap_inflight` at a time (their receive buffers: that many buckets), and the
//    exchanges progress whenever the caller polls; the sums are the same operations.
//  - allreduce_sum_i64: the same reduce-scatter on integers (exact in any order; done the same
//    way so the byte counts cover it), then the all-gather.
//  - allgather_ranges / allgatherv_bytes / broadcast / barrier: the backend's, cut into rounds
//    that keep every count within an int.
//  - gatherv_bytes: the sizes all-gathered, then rounds of all-to-alls in which every rank
//    sends only to the root (at most bucket_bytes each per round).
#pragma once
#include <cstdint>
#include <vector>

#include "dist/comm.h"
#include "train/parallel.h"

namespace k3::dist {

class CommDataParallel : public DataParallel {
 public:
  explicit CommDataParallel(Comm& comm, int64_t bucket_bytes = int64_t(4) << 20, int inflight = 2,
                            int overlap_inflight = 16);
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void reduce_sum_ordered(float* g, int64_t n, const std::vector<int64_t>& bounds, bool all,
                          const char* label) override;
  std::unique_ptr<OrderedReduction> begin_reduce_sum_ordered(float* g, int64_t n, const std::vector<int64_t>& bounds,
                                                             bool all, const char* label) override;
  void allgather_ranges(float* x, const std::vector<int64_t>& bounds, const char* label) override;
  void allreduce_sum_i64(int64_t* v, int64_t n, const char* label) override;
  void allgatherv_bytes(const void* mine, size_t bytes, std::vector<unsigned char>& out, std::vector<size_t>* counts,
                        const char* label) override;
  void gatherv_bytes(const void* mine, size_t bytes, int root, std::vector<unsigned char>& out,
                     std::vector<size_t>* counts, const char* label) override;
  void broadcast_bytes(void* data, size_t bytes, int root, const char* label) override;
  void barrier(const char* label) override;
  Comm& comm() { return comm_; }
  // Over every progressive reduction finished so far: its buckets, and those of them posted
  // before finish() (while the caller was still computing).
  int64_t overlap_buckets() const { return overlap_buckets_; }
  int64_t overlap_buckets_early() const { return overlap_early_; }
  void note_overlap(int64_t buckets, int64_t early) { overlap_buckets_ += buckets, overlap_early_ += early; }
  int64_t bucket_bytes() const { return bucket_bytes_; }

  // Element-type-generic forms (float and int64_t are instantiated).
  template <typename T>
  void reduce_scatter_ordered(T* g, int64_t n, const std::vector<int64_t>& bounds, const std::string& label);
  template <typename T>
  void allgather_ranges_t(T* x, const std::vector<int64_t>& bounds, const std::string& label);

 private:
  Comm& comm_;
  int64_t bucket_bytes_;
  int inflight_, overlap_inflight_;
  int64_t overlap_buckets_ = 0, overlap_early_ = 0;
};

// bounds splitting [0, n) into `parts` ranges of nearly equal size.
std::vector<int64_t> even_bounds(int64_t n, int parts);

}  // namespace k3::dist
