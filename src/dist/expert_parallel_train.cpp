// Expert parallelism in training (see expert_parallel_train.h).
#include "dist/expert_parallel_train.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "dist/data_parallel.h"

namespace k3::dist {

namespace {

std::unique_ptr<MpiComm> split(const MpiComm& world, int color) {
  MPI_Comm c = MPI_COMM_NULL;
  if (MPI_Comm_split(world.handle(), color, world.rank(), &c) != MPI_SUCCESS)
    fail("expert parallelism: MPI_Comm_split failed");
  auto out = std::make_unique<MpiComm>(c, world.timeout_s());
  MPI_Comm_free(&c);
  return out;
}

}  // namespace

CommExpertTraining::CommExpertTraining(const MpiComm& world, int group_size, bool per_source)
    : G_(group_size), per_source_(per_source) {
  const int N = world.size();
  if (G_ < 1 || N % G_ != 0)
    fail("--ep " + std::to_string(G_) + " does not divide the job's " + std::to_string(N) + " ranks");
  j_ = world.rank() % G_, g_ = world.rank() / G_, D_ = N / G_;
  group_ = split(world, g_);
  replica_ = split(world, j_);
  const size_t nr = static_cast<size_t>(G_);
  sc_.resize(nr), sd_.resize(nr), rc_.resize(nr), rd_.resize(nr);
}

void CommExpertTraining::bind_gradients(const std::vector<std::vector<ExpertGrad>>& owned, int64_t n_in, int64_t F) {
  bound_ = owned;
  n_in_ = n_in, F_ = F;
  acc_.assign(owned.size(), {});  // the other G - 1 sources' (this rank's own goes to the bound views)
  if (per_source_)
    for (size_t l = 0; l < owned.size(); ++l)
      acc_[l].assign(size_t(G_ - 1) * owned[l].size() * size_t(3 * F * n_in), 0.f);
}

void CommExpertTraining::begin_step() {
  K3_ASSERT(depth_ == 0, "expert parallelism: a forward was never backpropagated");
  for (auto& a : acc_) std::fill(a.begin(), a.end(), 0.f);
  const size_t M = size_t(F_ * n_in_);
  for (const auto& layer : bound_)
    for (const ExpertGrad& g : layer)
      for (float* m : {g.w1, g.w3, g.w2}) std::memset(m, 0, sizeof(float) * M);
}

// Source q's accumulator of owned expert i: this rank's own tokens' contribution goes
// straight into the bound gradient (summed in place by reduce_gradients), the others' into
// acc_ (source order, this rank skipped).
ExpertGrad CommExpertTraining::grad_of(size_t layer, int q, int64_t i) const {
  if (q == j_ || !per_source_) return bound_[layer][size_t(i)];
  const int64_t M = F_ * n_in_, per = int64_t(bound_[layer].size());
  const int slot = q < j_ ? q : q - 1;
  float* base = const_cast<float*>(acc_[layer].data()) + (int64_t(slot) * per + i) * 3 * M;
  return {base, base + M, base + 2 * M};
}

// Send side from this rank's dispatch: peer p gets positions [offset[p E/G], offset[(p+1) E/G]).
void CommExpertTraining::peer_layout(const MoEDispatch& dp, int64_t E, int64_t row_bytes) {
  const int64_t per = E / G_;
  for (int p = 0; p < G_; ++p) {
    const int64_t a = dp.offset[size_t(p * per)], b = dp.offset[size_t((p + 1) * per)];
    sc_[size_t(p)] = (b - a) * row_bytes, sd_[size_t(p)] = a * row_bytes;
  }
}

CommExpertTraining::Frame& CommExpertTraining::frame_of(const MoEDispatch& dp, int64_t E, int64_t n_in, bool fwd) {
  K3_ASSERT(E % G_ == 0, "expert parallelism: the expert count must be a multiple of --ep");
  const int64_t per = E / G_;
  if (!fwd) {
    K3_ASSERT(depth_ > 0, "expert parallelism: a backward without its forward");
    Frame& f = frames_[--depth_];
    peer_layout(dp, E, n_in * int64_t(sizeof(float)));
    return f;
  }
  K3_ASSERT(depth_ < bound_.size(), "expert parallelism: more MoE layer calls than bound layers (bind_gradients)");
  if (depth_ == frames_.size()) frames_.emplace_back();
  Frame& f = frames_[depth_++];
  // Counts first: this rank's per-expert row counts, expert order = destination order.
  std::vector<int64_t>& mine = mine_;
  mine.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) mine[size_t(e)] = dp.offset[size_t(e) + 1] - dp.offset[size_t(e)];
  f.counts.assign(size_t(E), 0);
  for (int p = 0; p < G_; ++p) {
    sc_[size_t(p)] = rc_[size_t(p)] = per * int64_t(sizeof(int64_t));
    sd_[size_t(p)] = rd_[size_t(p)] = p * per * int64_t(sizeof(int64_t));
  }
  Comm::RequestPtr r = group_->ialltoallv(mine.data(), sc_.data(), sd_.data(), f.counts.data(), rc_.data(), rd_.data(),
                                          "ep.fwd.counts");
  group_->wait(r);
  f.begin.assign(size_t(E) + 1, 0);
  for (int64_t b = 0; b < E; ++b) f.begin[size_t(b) + 1] = f.begin[size_t(b)] + f.counts[size_t(b)];
  peer_layout(dp, E, n_in * int64_t(sizeof(float)));
  for (int p = 0; p < G_; ++p)
    if (p != j_) rows_sent_ += sc_[size_t(p)] / (n_in * int64_t(sizeof(float)));
  return f;
}

void CommExpertTraining::forward(float* y, const float* rows, const MoEDispatch& dp, const ExpertMatrix* w1,
                                 const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t E, int64_t n_in, int64_t F,
                                 double b1, double b2, const std::function<void()>& overlap) {
  Frame& f = frame_of(dp, E, n_in, true);
  const int64_t per = E / G_, rb = n_in * int64_t(sizeof(float));
  for (int q = 0; q < G_; ++q)
    rc_[size_t(q)] = (f.begin[size_t((q + 1) * per)] - f.begin[size_t(q * per)]) * rb,
    rd_[size_t(q)] = f.begin[size_t(q * per)] * rb;
  const int64_t n = f.begin.back();
  f.rows.resize(size_t(n * n_in));
  Comm::RequestPtr r =
      group_->ialltoallv(rows, sc_.data(), sd_.data(), f.rows.data(), rc_.data(), rd_.data(), "ep.fwd.dispatch");
  group_->wait(r);
  // Each (source, expert) block on its own, as the source's own process would run it.
  f.gu.resize(size_t(n * 2 * F));
  out_.resize(size_t(n * n_in));
  int64_t max_n = 0;
  for (int64_t b = 0; b < E; ++b) max_n = std::max(max_n, f.counts[size_t(b)]);
  const int nthreads = omp_get_max_threads();
  work_.resize(size_t(std::max<int64_t>(1, max_n * F) * nthreads));
#pragma omp parallel for schedule(dynamic, 1) if (E > 1)
  for (int64_t b = 0; b < E; ++b) {
    const int64_t m = f.counts[size_t(b)], at = f.begin[size_t(b)];
    if (m == 0) continue;
    const int64_t e = int64_t(j_) * per + b % per;
    float* act = work_.data() + size_t(max_n * F) * size_t(omp_get_thread_num());
    moe_expert_rows_forward(f.gu.data() + at * 2 * F, act, out_.data() + at * n_in, f.rows.data() + at * n_in, w1[e],
                            w3[e], w2[e], m, n_in, F, b1, b2);
  }
  // The outputs travel back while the caller's shared experts run.
  r = group_->ialltoallv(out_.data(), rc_.data(), rd_.data(), y, sc_.data(), sd_.data(), "ep.fwd.combine");
  overlap();
  group_->wait(r);
}

void CommExpertTraining::backward(float* dz, const float* dy, const MoEDispatch& dp, const ExpertMatrix* w1,
                                  const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t E, int64_t n_in, int64_t F,
                                  double b1, double b2, const std::function<void()>& overlap) {
  Frame& f = frame_of(dp, E, n_in, false);
  const size_t layer = depth_;
  const int64_t per = E / G_, rb = n_in * int64_t(sizeof(float));
  K3_ASSERT(n_in == n_in_ && F == F_ && per == int64_t(bound_[layer].size()), "expert parallelism: shapes differ from the bound gradients");
  for (int q = 0; q < G_; ++q)
    rc_[size_t(q)] = (f.begin[size_t((q + 1) * per)] - f.begin[size_t(q * per)]) * rb,
    rd_[size_t(q)] = f.begin[size_t(q * per)] * rb;
  const int64_t n = f.begin.back();
  std::vector<float>& dyr = dyr_;
  dyr.resize(size_t(n * n_in));
  Comm::RequestPtr r = group_->ialltoallv(dy, sc_.data(), sd_.data(), dyr.data(), rc_.data(), rd_.data(), "ep.bwd.dispatch");
  overlap();  // the shared experts' weight gradients while the rows travel
  group_->wait(r);
  out_.resize(size_t(n * n_in));
  int64_t max_n = 0;
  for (int64_t b = 0; b < E; ++b) max_n = std::max(max_n, f.counts[size_t(b)]);
  const int nthreads = omp_get_max_threads();
  work_.resize(size_t(std::max<int64_t>(1, 4 * max_n * F) * nthreads));
  // One thread per owned expert, its sources in rank order: per source, each (source, expert)
  // block has its own accumulator; fused, the sources accumulate into one, in that order.
#pragma omp parallel for schedule(dynamic, 1) if (per > 1)
  for (int64_t i = 0; i < per; ++i)
    for (int q = 0; q < G_; ++q) {
      const int64_t b = int64_t(q) * per + i;
      const int64_t m = f.counts[size_t(b)], at = f.begin[size_t(b)];
      if (m == 0) continue;
      const int64_t e = int64_t(j_) * per + i;
      float* work = work_.data() + size_t(4 * max_n * F) * size_t(omp_get_thread_num());
      moe_expert_rows_backward(out_.data() + at * n_in, grad_of(layer, q, i), dyr.data() + at * n_in,
                               f.rows.data() + at * n_in, f.gu.data() + at * 2 * F, w1[e], w3[e], w2[e], m, n_in, F,
                               b1, b2, work);
    }
  r = group_->ialltoallv(out_.data(), rc_.data(), rd_.data(), dz, sc_.data(), sd_.data(), "ep.bwd.combine");
  group_->wait(r);
}

// Every contribution to an owned expert, in world rank order: replica d's source q is world
// rank d G + q, so the pieces are summed d-major, ((p_00 + p_01) + p_10) + ... in float, and
// written over this rank's own piece (the bound views; element by element, each read before
// it is written). With replicas, the pieces travel a few experts at a time (at most about
// kReplicaChunkBytes gathered at once), not a layer's whole.
void CommExpertTraining::reduce_gradients() {
  K3_ASSERT(depth_ == 0, "expert parallelism: a forward was never backpropagated");
  const int64_t M = F_ * n_in_;
  const int S = per_source_ ? G_ : 1;  // pieces per replica (fused: the sources already summed)
  const int64_t pieces = int64_t(D_) * S;
  if (pieces == 1) return;
  CommDataParallel rep(*replica_);
  std::vector<float> send, all;
  std::vector<const float*> src(static_cast<size_t>(pieces));
  for (size_t l = 0; l < acc_.size(); ++l) {
    const int64_t per = int64_t(bound_[l].size());
    const int64_t chunk = D_ > 1 ? std::clamp<int64_t>(kReplicaChunkBytes / (4 * pieces * 3 * M), 1, per) : per;
    for (int64_t i0 = 0; i0 < per; i0 += chunk) {
      const int64_t i1 = std::min(per, i0 + chunk), c = i1 - i0;
      if (D_ > 1) {  // [G sources][c experts][w1 | w3 | w2], then every replica's in replica order
        send.resize(size_t(S * c * 3 * M));
        for (int q = 0; q < S; ++q)
          for (int64_t i = i0; i < i1; ++i) {
            const ExpertGrad g = grad_of(l, q, i);
            float* d = send.data() + (int64_t(q) * c + i - i0) * 3 * M;
            std::memcpy(d, g.w1, sizeof(float) * size_t(M));
            std::memcpy(d + M, g.w3, sizeof(float) * size_t(M));
            std::memcpy(d + 2 * M, g.w2, sizeof(float) * size_t(M));
          }
        all = rep.allgatherv(send.data(), send.size(), "ep.grad.replicas");
      }
#pragma omp parallel for schedule(static) if (c * 3 > 1) firstprivate(src)
      for (int64_t im = 0; im < c * 3; ++im) {
        const int64_t i = i0 + im / 3, m = im % 3;
        const ExpertGrad& g = bound_[l][size_t(i)];
        float* out = m == 0 ? g.w1 : m == 1 ? g.w3 : g.w2;
        for (int64_t p = 0; p < pieces; ++p) {
          if (D_ > 1) {
            src[size_t(p)] = all.data() + ((p * c) + (i - i0)) * 3 * M + m * M;  // p = d S + q
          } else {
            const ExpertGrad s = grad_of(l, int(p), i);
            src[size_t(p)] = m == 0 ? s.w1 : m == 1 ? s.w3 : s.w2;
          }
        }
        for (int64_t x = 0; x < M; ++x) {
          float a = src[0][x];
          for (int64_t p = 1; p < pieces; ++p) a += src[size_t(p)][x];
          out[x] = a;
        }
      }
    }
  }
}

std::map<std::string, CollectiveStats> CommExpertTraining::stats() const {
  std::map<std::string, CollectiveStats> out = group_->stats();
  for (const auto& [k, v] : replica_->stats()) {
    CollectiveStats& s = out[k];
    s.calls += v.calls, s.bytes_sent += v.bytes_sent;
  }
  return out;
}

}  // namespace k3::dist
