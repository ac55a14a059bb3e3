// Expert parallelism in training under mpirun (ctest dist_np1, dist_np2, dist_np4; also the
// DP x EP layout, 2 groups of 2, at 4 ranks):
//  - The exchange (dist/expert_parallel_train.h) on the kernels (moe_experts_forward /
//    backward): every rank with its own tokens (different counts per rank, an expert left
//    without rows), the experts split over the group: the mixture, the saved outputs, dz and
//    the mixture-weight gradients equal the single process's computation of the same tokens,
//    bitwise; the owners' summed expert gradients equal the rank-ordered sum of every rank's
//    own gradients, bitwise; the shared-expert overlap runs once per forward and once per backward; the bytes each
//    rank hands MPI for the dispatch equal the routing's count (rows to other ranks' experts x
//    n_in x 4), the counts' all-to-all (E/G x 8 per peer), and the combine the rows that
//    came in.
//  - Training: N ranks x 1 thread with the experts split (groups of N; at 4 ranks also 2 x 2),
//    the trunk's optimiser replicated or sharded over all N ranks (ZeRO-1), equal one process
//    of N threads, bitwise: every step's loss, gradient norm, summed
//    gradients, weights (QB router biases included; the trainer also compares the biases
//    across ranks after every step), evaluations, optimiser state and the checkpoint. Bitwise
//    because the owner runs each expert on each source rank's rows separately, accumulating
//    per source, and sums the sources in rank order: the single process's float operations.
//    Memory: after the run no page inside another rank's experts is resident in a rank's
//    weight or gradient buffer (mincore), and after gathering them there are such pages.
//  - Fused accumulation (--ep-accumulate fused: one gradient per expert, no per-source
//    buffers): the kernel-level gradients equal the rank-ordered sum to 1e-5 relative, the
//    training losses one process's to 1e-4 relative.
//  - Resume: a run stopped at step 2 under one layout and resumed under another (4 ranks:
//    groups of 4, then 2 x 2 with ZeRO-1; 2 ranks: groups of 2, then plain data parallelism
//    with ZeRO-1) ends with the uninterrupted run's weights and optimiser state.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/threads.h"
#include "dist/expert_parallel_train.h"
#include "dist/mpi_comm.h"
#include "dist_test_util.h"
#include "kernels/moe.h"
#include "kernels/moe_exchange.h"

namespace k3::test {

namespace {

// One rank's tokens for the kernel-level test: z [T, n], routing [T, k] (distinct experts,
// expert E - 1 never chosen), mixture weights, output gradient du [T, n].
struct Tokens {
  int64_t T = 0;
  std::vector<float> z, w, du;
  std::vector<int32_t> idx;
};

Tokens tokens_of(int rank, int64_t E, int64_t k, int64_t n) {
  std::mt19937 rng(1000u + unsigned(rank));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tokens t;
  t.T = 5 + 3 * rank;
  t.z.resize(size_t(t.T * n)), t.du.resize(size_t(t.T * n));
  for (float& v : t.z) v = u(rng);
  for (float& v : t.du) v = u(rng);
  for (int64_t i = 0; i < t.T; ++i) {
    std::vector<int32_t> pick;
    while (int64_t(pick.size()) < k) {
      const int32_t e = int32_t(rng() % uint32_t(E - 1));
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    for (int32_t e : pick) t.idx.push_back(e), t.w.push_back(0.25f + 0.5f * (u(rng) + 1.f));
  }
  return t;
}

struct Experts {
  std::vector<std::vector<float>> m1, m3, m2;
  std::vector<ExpertMatrix> e1, e3, e2;
  Experts(int64_t E, int64_t n, int64_t F) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (int64_t e = 0; e < E; ++e) {
      for (auto* m : {&m1, &m3, &m2}) {
        m->emplace_back(size_t(n * F));
        for (float& v : m->back()) v = u(rng);
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      e1.push_back({m1[size_t(e)].data(), nullptr, F, n});
      e3.push_back({m3[size_t(e)].data(), nullptr, F, n});
      e2.push_back({m2[size_t(e)].data(), nullptr, n, F});
    }
  }
};

// Every expert's gradient from one rank's tokens, on one process (no exchange).
struct LocalRun {
  std::vector<float> u, gu, y, dz, dtw, grads;  // grads [E][w1 | w3 | w2]
};

LocalRun local_run(const Tokens& t, const Experts& x, int64_t E, int64_t k, int64_t n, int64_t F) {
  LocalRun r;
  MoEExpertScratch s;
  r.u.resize(size_t(t.T * n)), r.gu.resize(size_t(t.T * k * 2 * F)), r.y.resize(size_t(t.T * k * n));
  moe_experts_forward(r.u.data(), t.z.data(), t.idx.data(), t.w.data(), x.e1.data(), x.e3.data(), x.e2.data(), t.T, n,
                      F, E, k, 4.0, 25.0, s, r.gu.data(), r.y.data());
  r.grads.assign(size_t(E * 3 * n * F), 0.f);
  std::vector<ExpertGrad> g;
  for (int64_t e = 0; e < E; ++e) {
    float* b = r.grads.data() + e * 3 * n * F;
    g.push_back({b, b + n * F, b + 2 * n * F});
  }
  r.dz.resize(size_t(t.T * n)), r.dtw.resize(size_t(t.T * k));
  moe_experts_backward(r.dz.data(), r.dtw.data(), g.data(), t.du.data(), r.gu.data(), r.y.data(), t.z.data(),
                       t.idx.data(), t.w.data(), x.e1.data(), x.e3.data(), x.e2.data(), t.T, n, F, E, k, 4.0, 25.0, s);
  return r;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

}  // namespace

TEST(DistRanks, ExpertTrainExchangeEqualsLocalExpertsAndCountsItsBytes) {
  Group grp;
  const int N = grp.dp->size(), me = grp.dp->rank();
  const int64_t E = 8, k = 2, n = 8, F = 12;
  set_num_threads(1);
  const Experts x(E, n, F);
  std::vector<Tokens> all;
  for (int r = 0; r < N; ++r) all.push_back(tokens_of(r, E, k, n));
  std::vector<LocalRun> ref;
  for (int r = 0; r < N; ++r) ref.push_back(local_run(all[size_t(r)], x, E, k, n, F));
  std::vector<int> sizes = {N};
  if (N == 4) sizes.push_back(2);
  for (const int G : sizes)
  for (const bool per_source : {true, false}) {
    dist::CommExpertTraining ex(static_cast<const dist::MpiComm&>(*grp.comm), G, per_source);
    const int64_t per = E / G;
    const int j = me % G, g0 = me - j;  // group rank, first world rank of the group
    std::vector<float> owned(size_t(per * 3 * n * F), -1.f);
    std::vector<std::vector<ExpertGrad>> views(1);
    for (int64_t i = 0; i < per; ++i) {
      float* b = owned.data() + i * 3 * n * F;
      views[0].push_back({b, b + n * F, b + 2 * n * F});
    }
    ex.bind_gradients(views, n, F);
    ex.begin_step();
    const Tokens& t = all[size_t(me)];
    LocalRun got;
    MoEExpertScratch s;
    got.u.resize(size_t(t.T * n)), got.gu.resize(size_t(t.T * k * 2 * F)), got.y.resize(size_t(t.T * k * n));
    int overlaps = 0;
    const std::function<void()> overlap = [&] { ++overlaps; };
    set_expert_train_exchange(&ex);
    moe_experts_forward(got.u.data(), t.z.data(), t.idx.data(), t.w.data(), x.e1.data(), x.e3.data(), x.e2.data(),
                        t.T, n, F, E, k, 4.0, 25.0, s, got.gu.data(), got.y.data(), nullptr, &overlap);
    got.dz.resize(size_t(t.T * n)), got.dtw.resize(size_t(t.T * k));
    moe_experts_backward(got.dz.data(), got.dtw.data(), nullptr, t.du.data(), got.gu.data(), got.y.data(), t.z.data(),
                         t.idx.data(), t.w.data(), x.e1.data(), x.e3.data(), x.e2.data(), t.T, n, F, E, k, 4.0, 25.0,
                         s, &overlap);
    set_expert_train_exchange(nullptr);
    ex.reduce_gradients();
    const std::string what = "group size " + std::to_string(G) + (per_source ? "" : " fused") + ", rank " + std::to_string(me);
    EXPECT_EQ(overlaps, 2) << what;  // once in the forward, once in the backward
    EXPECT_TRUE(same(got.u, ref[size_t(me)].u)) << what << ": mixture";
    EXPECT_TRUE(same(got.y, ref[size_t(me)].y)) << what << ": saved outputs";
    EXPECT_TRUE(same(got.dz, ref[size_t(me)].dz)) << what << ": dz";
    EXPECT_TRUE(same(got.dtw, ref[size_t(me)].dtw)) << what << ": mixture-weight gradients";
    // Owned experts: every rank's gradient, summed in world rank order.
    std::vector<float> want(owned.size());
    for (int64_t i = 0; i < per; ++i)
      for (int64_t c = 0; c < 3 * n * F; ++c) {
        const int64_t at = (int64_t(j) * per + i) * 3 * n * F + c;
        float a = ref[0].grads[size_t(at)];
        for (int r = 1; r < N; ++r) a += ref[size_t(r)].grads[size_t(at)];
        want[size_t(i * 3 * n * F + c)] = a;
      }
    if (per_source) {
      EXPECT_TRUE(same(owned, want)) << what << ": owned experts' summed gradients";
    } else {  // fused: another summation order, equal to rounding
      double err = 0, mag = 0;
      for (size_t x = 0; x < want.size(); ++x)
        err = std::max(err, double(std::fabs(owned[x] - want[x]))), mag = std::max(mag, double(std::fabs(want[x])));
      EXPECT_LT(err, 1e-5 * mag) << what << ": owned experts' summed gradients";
      EXPECT_GT(mag, 0) << what;
    }
    // Bytes: the routing's rows to other ranks' experts, and the rows that came in.
    int64_t out_rows = 0, in_rows = 0;
    for (int32_t e : t.idx) out_rows += int64_t(e) / per != j;
    for (int q = g0; q < g0 + G; ++q)
      if (q != me)
        for (int32_t e : all[size_t(q)].idx) in_rows += int64_t(e) / per == j;
    const auto st = ex.stats();
    auto bytes = [&](const char* l) { return st.count(l) ? st.at(l).bytes_sent : int64_t(-1); };
    EXPECT_EQ(ex.rows_sent(), out_rows) << what;
    EXPECT_EQ(bytes("ep.fwd.dispatch"), out_rows * n * 4) << what;
    EXPECT_EQ(bytes("ep.bwd.dispatch"), out_rows * n * 4) << what;
    EXPECT_EQ(bytes("ep.fwd.combine"), in_rows * n * 4) << what;
    EXPECT_EQ(bytes("ep.bwd.combine"), in_rows * n * 4) << what;
    EXPECT_EQ(bytes("ep.fwd.counts"), (G - 1) * per * 8) << what;
    if (N / G > 1) {
      EXPECT_EQ(bytes("ep.grad.replicas"), int64_t(owned.size()) * (per_source ? G : 1) * 4 * (N / G - 1)) << what;
    }
  }
}

namespace {

// The run of the data-parallel test (two stages, evaluations, a checkpoint at step 4).
nlohmann::json ep_run() {
  nlohmann::json run = tiny_run();
  run["stages"] = nlohmann::json::parse(R"([
    {"name": "s1", "seq_len": 16, "tokens": 768, "lr_peak": 0.01, "lr_end": 0.01, "warmup_steps": 1},
    {"name": "s2", "seq_len": 32, "tokens": 768, "lr_peak": 0.01, "lr_end": 0.002, "decay_frac": 0.5}])");
  run["eval_every"] = 2, run["eval_tokens"] = 256, run["checkpoint_every"] = 4;
  run["balancer"] = "qb-hist", run["optimizer"] = "muon", run["qb_bins"] = 64;
  return run;
}

// Trains to step `stop` under one layout, then resumes to the end under another (ep null:
// plain data parallelism); the final weights and optimiser state.
// The first part replicates the trunk's optimiser, the second shards it (ZeRO-1).
std::pair<std::vector<float>, std::vector<float>> stop_and_resume(const std::string& run_path, const std::string& out,
                                                                  DataParallel& dp, ExpertParallelTraining* first,
                                                                  ExpertParallelTraining* second, int64_t stop) {
  TrainOptions o;
  o.out_dir = out, o.quiet = true, o.threads = 1, o.dp = &dp, o.shard_optimizer = false;
  o.ep = first, o.stop_at_step = stop;
  { Trainer(load_run_config(run_path), o).run(); }
  o.ep = second, o.stop_at_step = -1, o.resume = true, o.shard_optimizer = true;
  Trainer t(load_run_config(run_path), o);
  t.run();
  t.sync_expert_weights();
  const WeightStore& w = t.model().weights();
  return {std::vector<float>(w.data(), w.data() + w.size()), t.optimizer_state()};
}

}  // namespace

TEST(DistRanks, ExpertParallelTrainingEqualsOneProcessBitwise) {
  Group grp;
  DataParallel& dp = *grp.dp;
  const int N = dp.size();
  SharedDir dir(dp);
  const nlohmann::json run = ep_run();
  Trace ref;
  if (dp.rank() == 0) {
    write_run_files(dir.path, run);
    ref = trace_run(dir.path + "/run.json", dir.path + "/ref", N, nullptr, false);  // one process, N threads
  }
  dp.barrier("test.ref");
  const auto& mpi = static_cast<const dist::MpiComm&>(*grp.comm);
  // (expert-parallel ranks per group, ZeRO-1 of the trunk)
  std::vector<std::pair<int, bool>> layouts = {{N, false}};  // EP only: one group of every rank
  if (N > 1) layouts.push_back({N, true});
  if (N == 4) layouts.push_back({2, false}), layouts.push_back({2, true});  // DP x EP: two groups of two
  for (const auto& [G, zero] : layouts) {
    dist::CommExpertTraining ex(mpi, G);
    const std::string name = std::to_string(N / G) + " x " + std::to_string(G) + " (groups x expert-parallel ranks)" +
                             (zero ? ", ZeRO-1 trunk" : ", replicated trunk");
    const std::string out = dir.path + "/ep" + std::to_string(G) + (zero ? "z" : "");
    const Trace got = trace_run(dir.path + "/run.json", out, 1, &dp, zero, &ex);
    // Memory: no page inside the other ranks' experts is held after training (the weights'
    // were given back after the evaluations and the checkpoint, the gradients' never written);
    // gathered, they are.
    if (G > 1) {
      EXPECT_EQ(got.foreign_resident, 0) << name << ", rank " << dp.rank();
      EXPECT_GT(got.foreign_resident_synced, 0) << name << ", rank " << dp.rank();
    }
    // The routed biases (part of the weights) are the same on every rank.
    const std::string bias_hash = content_hash(got.weights.data(), got.weights.size() * sizeof(float));
    dp.check_identical(bias_hash.data(), bias_hash.size(), "weights after the run (QB router biases among them)");
    // The dispatch bytes are the routing's count.
    const auto st = ex.stats();
    ASSERT_TRUE(N == 1 || st.count("ep.fwd.dispatch")) << name;
    if (N > 1) {
      EXPECT_EQ(st.at("ep.fwd.dispatch").bytes_sent, ex.rows_sent() * 16 * 4) << name;  // latent width 16
      EXPECT_GT(ex.rows_sent(), 0) << name;
    }
    if (dp.rank() != 0) continue;
    expect_same_steps(got, ref, name);
    EXPECT_TRUE(same(got.weights, ref.weights)) << name;
    EXPECT_TRUE(got.opt_state == ref.opt_state) << name << ": optimiser state";
    EXPECT_FALSE(ref.evals.empty());
    EXPECT_EQ(got.evals, ref.evals) << name;
    EXPECT_EQ(got.ckpt_weights_hash, ref.ckpt_weights_hash) << name;
    EXPECT_EQ(got.ckpt_opt_hash, ref.ckpt_opt_hash) << name;
    const K3Model m = load_model(out + "/checkpoint");
    const float* b = m.weights().param("language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias");
    bool moved = false;
    for (int e = 0; e < 8; ++e) moved |= b[e] != 0.0f;
    EXPECT_TRUE(moved) << name;
  }
  // Fused accumulation (no per-source buffers): another float summation of the experts'
  // gradients, so equal to one process to rounding only (amplified a little by training).
  if (N > 1) {
    dist::CommExpertTraining fused(mpi, N, false);
    const Trace got = trace_run(dir.path + "/run.json", dir.path + "/fused", 1, &dp, true, &fused);
    EXPECT_EQ(got.foreign_resident, 0);
    if (dp.rank() == 0) {
      ASSERT_EQ(got.loss.size(), ref.loss.size());
      for (size_t i = 0; i < ref.loss.size(); ++i)
        EXPECT_NEAR(got.loss[i], ref.loss[i], 1e-4 * ref.loss[i]) << "fused, step " << i + 1;
    }
  }
  // Resume under another layout: the checkpoint is whole, so it re-shards.
  dist::CommExpertTraining first(mpi, N);
  std::unique_ptr<dist::CommExpertTraining> second;
  if (N == 4) second = std::make_unique<dist::CommExpertTraining>(mpi, 2);
  const auto [w, os] = stop_and_resume(dir.path + "/run.json", dir.path + "/resumed", dp, &first, second.get(), 2);
  if (dp.rank() == 0) {
    EXPECT_TRUE(same(w, ref.weights)) << "stopped at step 2 with groups of " << N << ", resumed "
                                      << (second ? "with groups of 2" : "data-parallel only") << " and ZeRO-1";
    EXPECT_TRUE(os == ref.opt_state) << "resumed optimiser state";
  }
}

}  // namespace k3::test
