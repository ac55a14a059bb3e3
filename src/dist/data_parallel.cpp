// Data-parallel collectives over a Comm (see data_parallel.h).
#include "dist/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "dist/ordered_reduction.h"
#include "dist/runtime.h"

namespace k3::dist {

std::vector<int64_t> even_bounds(int64_t n, int parts) {
  std::vector<int64_t> b(size_t(parts) + 1);
  for (int r = 0; r <= parts; ++r) b[size_t(r)] = n * r / parts;
  return b;
}

CommDataParallel::CommDataParallel(Comm& comm, int64_t bucket_bytes, int inflight, int overlap_inflight)
    : comm_(comm), bucket_bytes_(std::max<int64_t>(bucket_bytes, 64)), inflight_(std::max(1, inflight)),
      overlap_inflight_(std::max(1, overlap_inflight)) {}

template <typename T>
void CommDataParallel::reduce_scatter_ordered(T* g, int64_t n, const std::vector<int64_t>& bounds,
                                              const std::string& label) {
  BucketedReduceScatter<T> rs(comm_, g, n, bounds, bucket_bytes_ / int64_t(sizeof(T)), inflight_, label);
  rs.finish();
}

namespace {

// begin_reduce_sum_ordered's reduction: the reduce-scatter fed ranges, then the all-gather.
class CommOrderedReduction : public OrderedReduction {
 public:
  CommOrderedReduction(CommDataParallel& dp, float* g, int64_t n, const std::vector<int64_t>& bounds, bool all,
                       const std::string& label, int inflight)
      : dp_(dp), g_(g), bounds_(bounds), all_(all), label_(label),
        rs_(dp.comm(), g, n, bounds, dp.bucket_bytes() / int64_t(sizeof(float)), inflight, label + ".reduce_scatter") {}
  void ready(int64_t lo, int64_t hi) override { rs_.ready(lo, hi); }
  void poll() override { rs_.poll(); }
  void finish() override {
    if (done_) return;
    done_ = true;
    rs_.finish();
    dp_.note_overlap(rs_.buckets(), rs_.posted_before_finish());
    if (all_) dp_.allgather_ranges_t(g_, bounds_, label_ + ".allgather");
  }

 private:
  CommDataParallel& dp_;
  float* g_;
  std::vector<int64_t> bounds_;
  bool all_, done_ = false;
  std::string label_;
  BucketedReduceScatter<float> rs_;
};

}  // namespace

std::unique_ptr<OrderedReduction> CommDataParallel::begin_reduce_sum_ordered(float* g, int64_t n,
                                                                             const std::vector<int64_t>& bounds,
                                                                             bool all, const char* label) {
  maybe_inject_fault(rank(), label);
  return std::make_unique<CommOrderedReduction>(*this, g, n, bounds, all, label, std::max(inflight_, overlap_inflight_));
}

template <typename T>
void CommDataParallel::allgather_ranges_t(T* x, const std::vector<int64_t>& bounds, const std::string& label) {
  const int N = size(), me = rank();
  K3_ASSERT(int(bounds.size()) == N + 1, label + ": bounds");
  if (N == 1) return;
  // Rounds of at most C elements per rank, through a staging buffer (int displacements).
  const int64_t C = std::max<int64_t>(1, bucket_bytes_ / int64_t(sizeof(T)));
  int64_t longest = 0;
  for (int r = 0; r < N; ++r) longest = std::max(longest, bounds[size_t(r) + 1] - bounds[size_t(r)]);
  std::vector<T> stage;
  const size_t nr = static_cast<size_t>(N);
  std::vector<int64_t> cnt(nr), dsp(nr);
  for (int64_t k = 0; k * C < longest; ++k) {
    int64_t at = 0;
    for (int r = 0; r < N; ++r) {
      const int64_t len = bounds[size_t(r) + 1] - bounds[size_t(r)];
      const int64_t c = std::clamp<int64_t>(len - k * C, 0, C);
      cnt[size_t(r)] = c * int64_t(sizeof(T)), dsp[size_t(r)] = at * int64_t(sizeof(T));
      at += c;
    }
    stage.resize(size_t(at));
    comm_.allgatherv(x + bounds[size_t(me)] + k * C, stage.data(), cnt.data(), dsp.data(), label);
    for (int r = 0; r < N; ++r)
      if (r != me && cnt[size_t(r)] > 0)
        std::memcpy(x + bounds[size_t(r)] + k * C, stage.data() + dsp[size_t(r)] / int64_t(sizeof(T)), size_t(cnt[size_t(r)]));
  }
}

template void CommDataParallel::reduce_scatter_ordered<float>(float*, int64_t, const std::vector<int64_t>&,
                                                              const std::string&);
template void CommDataParallel::reduce_scatter_ordered<int64_t>(int64_t*, int64_t, const std::vector<int64_t>&,
                                                                const std::string&);
template void CommDataParallel::allgather_ranges_t<float>(float*, const std::vector<int64_t>&, const std::string&);
template void CommDataParallel::allgather_ranges_t<int64_t>(int64_t*, const std::vector<int64_t>&, const std::string&);

void CommDataParallel::reduce_sum_ordered(float* g, int64_t n, const std::vector<int64_t>& bounds, bool all,
                                          const char* label) {
  maybe_inject_fault(rank(), label);
  reduce_scatter_ordered(g, n, bounds, std::string(label) + ".reduce_scatter");
  if (all) allgather_ranges_t(g, bounds, std::string(label) + ".allgather");
}

void CommDataParallel::allgather_ranges(float* x, const std::vector<int64_t>& bounds, const char* label) {
  allgather_ranges_t(x, bounds, label);
}

void CommDataParallel::allreduce_sum_i64(int64_t* v, int64_t n, const char* label) {
  const std::vector<int64_t> b = even_bounds(n, size());
  reduce_scatter_ordered(v, n, b, std::string(label) + ".reduce_scatter");
  allgather_ranges_t(v, b, std::string(label) + ".allgather");
}

void CommDataParallel::allgatherv_bytes(const void* mine, size_t bytes, std::vector<unsigned char>& out,
                                        std::vector<size_t>* counts, const char* label) {
  const int N = size(), me = rank();
  std::vector<int64_t> sizes(size_t(N), 0);
  sizes[size_t(me)] = int64_t(bytes);
  {
    const size_t nr = static_cast<size_t>(N);
    std::vector<int64_t> c(nr, int64_t(sizeof(int64_t))), d(nr);
    for (int r = 0; r < N; ++r) d[size_t(r)] = r * int64_t(sizeof(int64_t));
    if (N > 1) comm_.allgatherv(&sizes[size_t(me)], sizes.data(), c.data(), d.data(), std::string(label) + ".sizes");
  }
  std::vector<int64_t> displs(size_t(N) + 1, 0);
  for (int r = 0; r < N; ++r) displs[size_t(r) + 1] = displs[size_t(r)] + sizes[size_t(r)];
  out.resize(size_t(displs[size_t(N)]));
  if (bytes) std::memcpy(out.data() + displs[size_t(me)], mine, bytes);
  if (N > 1) {
    std::vector<int64_t> b(displs.begin(), displs.end());
    allgather_ranges_t(out.data(), b, label);
  }
  if (counts) {
    counts->resize(size_t(N));
    for (int r = 0; r < N; ++r) (*counts)[size_t(r)] = size_t(sizes[size_t(r)]);
  }
}

void CommDataParallel::gatherv_bytes(const void* mine, size_t bytes, int root, std::vector<unsigned char>& out,
                                     std::vector<size_t>* counts, const char* label) {
  const int N = size(), me = rank();
  K3_ASSERT(root >= 0 && root < N, std::string(label) + ": root");
  std::vector<int64_t> sizes(size_t(N), 0);
  sizes[size_t(me)] = int64_t(bytes);
  const size_t nr = static_cast<size_t>(N);
  if (N > 1) {
    std::vector<int64_t> c(nr, int64_t(sizeof(int64_t))), d(nr);
    for (int r = 0; r < N; ++r) d[size_t(r)] = r * int64_t(sizeof(int64_t));
    comm_.allgatherv(&sizes[size_t(me)], sizes.data(), c.data(), d.data(), std::string(label) + ".sizes");
  }
  std::vector<int64_t> displs(nr + 1, 0);
  for (int r = 0; r < N; ++r) displs[size_t(r) + 1] = displs[size_t(r)] + sizes[size_t(r)];
  out.clear();
  if (me == root) {
    out.resize(size_t(displs[nr]));
    if (bytes) std::memcpy(out.data() + displs[size_t(me)], mine, bytes);
  }
  if (counts) {
    counts->resize(nr);
    for (int r = 0; r < N; ++r) (*counts)[size_t(r)] = size_t(sizes[size_t(r)]);
  }
  if (N == 1) return;
  int64_t longest = 0;
  for (int r = 0; r < N; ++r)
    if (r != root) longest = std::max(longest, sizes[size_t(r)]);
  const int64_t C = bucket_bytes_;
  std::vector<int64_t> sc(nr, 0), sd(nr, 0), rc(nr, 0), rd(nr, 0);
  const unsigned char* src = static_cast<const unsigned char*>(mine);
  std::vector<unsigned char> stage;
  for (int64_t k = 0; k * C < longest; ++k) {
    // Round k: bytes [k C, (k + 1) C) of every non-root rank's block.
    const int64_t off = k * C;
    std::fill(sc.begin(), sc.end(), 0), std::fill(rc.begin(), rc.end(), 0);
    if (me != root) sc[size_t(root)] = std::clamp<int64_t>(int64_t(bytes) - off, 0, C);
    if (me == root)
      for (int r = 0; r < N; ++r)
        if (r != root) rc[size_t(r)] = std::clamp<int64_t>(sizes[size_t(r)] - off, 0, C);
    // Through a staging buffer, so every displacement fits an int whatever the block sizes.
    int64_t at = 0;
    for (int r = 0; r < N; ++r) rd[size_t(r)] = at, at += rc[size_t(r)];
    stage.resize(size_t(std::max<int64_t>(at, 1)));
    Comm::RequestPtr q = comm_.ialltoallv(src + std::min<int64_t>(off, int64_t(bytes)), sc.data(), sd.data(),
                                          stage.data(), rc.data(), rd.data(), label);
    comm_.wait(q);
    if (me == root)
      for (int r = 0; r < N; ++r)
        if (rc[size_t(r)] > 0)
          std::memcpy(out.data() + displs[size_t(r)] + off, stage.data() + rd[size_t(r)], size_t(rc[size_t(r)]));
  }
}

void CommDataParallel::broadcast_bytes(void* data, size_t bytes, int root, const char* label) {
  if (size() > 1) comm_.bcast(data, int64_t(bytes), root, label);
}

void CommDataParallel::barrier(const char* label) {
  if (size() > 1) comm_.barrier(label);
}

}  // namespace k3::dist
