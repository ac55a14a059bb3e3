// Distributed training under mpirun (ctest dist_np1, dist_np2, dist_np4): every rank runs these
// tests together, over the MPI backend on loopback.
//  - The fixed-order reduction is the rank-ordered float sum, bit for bit, for any bucket size
//    and any split into owned ranges; the integer all-reduce is exact; the byte counters hold
//    the analytic volumes ((n - own) and own x (N - 1) elements).
//  - Quantile Balancing's statistics reduced across ranks are those of the global batch: each
//    rank observes its slice, and the biases (histogram and exact modes) and loads equal those
//    of one balancer that observed everything.
//  - N ranks of one thread, each a 1/N slice of every micro-batch, train exactly what one
//    process of N threads trains on the whole batch: per-step losses, gradient norms, summed
//    gradients, weights (the QB router biases among them), held-out evaluations, optimiser
//    state and the checkpoint, bitwise, with ZeRO-1 and without, Muon and AdamW, QB histogram
//    and exact. (Bitwise needs the same summation tree: one process of N threads sums N
//    per-thread buffers in thread order, which is the rank order the reduction uses; with T > 1
//    threads per rank the tree differs and results agree to float rounding only, see
//    docs/distributed.md.)
//  - Expert parallelism at inference: each rank computing 1/N of the routed experts of the
//    release-layout tiny model (MXFP4 experts), the rows combined by all-gather, gives the
//    single process's logits bitwise, prefill and decode.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>

#include "dist/comm.h"
#include "dist/data_parallel.h"
#include "dist/expert_parallel.h"
#include "dist/runtime.h"
#include "dist_env.h"
#include "dist_test_util.h"
#include "core/threads.h"
#include "infer/session.h"
#include "kernels/moe_exchange.h"
#include "model/checkpoint.h"
#include "train/balancer.h"
#include "train/run_config.h"
#include "train/test_trainer_util.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace k3::test {

void or_all_ranks(int mine, int* all) { MPI_Allreduce(&mine, all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD); }

namespace {

float value(int rank, int64_t i) {  // wide magnitudes, so that the summation order matters
  uint64_t h = uint64_t(rank + 1) * 0x9e3779b97f4a7c15ull ^ uint64_t(i) * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  const double u = double(h >> 11) / double(1ull << 53);
  return float((u - 0.5) * std::pow(10.0, double(int64_t(h % 7)) - 3.0));
}

// Uneven owned ranges (rank 0's empty when N > 1), as parameter boundaries make them.
std::vector<int64_t> uneven_bounds(int64_t n, int N) {
  std::vector<int64_t> bounds(size_t(N) + 1, n);
  bounds[0] = 0;
  for (int r = 1; r < N; ++r) bounds[size_t(r)] = n * r * r / (N * N) + (r == 1 ? 0 : 7);
  for (int r = 1; r <= N; ++r) bounds[size_t(r)] = std::max(bounds[size_t(r)], bounds[size_t(r) - 1]);
  return bounds;
}

}  // namespace

TEST(DistRanks, OrderedReductionIsTheRankOrderSumBitwise) {
  for (int64_t bucket : {int64_t(64), int64_t(1000), int64_t(4) << 20}) {
    Group g(bucket);
    DataParallel& dp = *g.dp;
    const int N = dp.size(), me = dp.rank();
    const int64_t n = 1237;
    const std::vector<int64_t> bounds = uneven_bounds(n, N);
    std::vector<float> x(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      x[size_t(i)] = value(me, i);
      float a = value(0, i);
      for (int r = 1; r < N; ++r) a += value(r, i);
      want[size_t(i)] = a;
    }
    std::vector<float> part = x;
    dp.reduce_sum_ordered(part.data(), n, bounds, false, "t");
    EXPECT_EQ(0, std::memcmp(part.data() + bounds[size_t(me)], want.data() + bounds[size_t(me)],
                             sizeof(float) * size_t(bounds[size_t(me) + 1] - bounds[size_t(me)])))
        << "owned range, bucket " << bucket;
    dp.reduce_sum_ordered(x.data(), n, bounds, true, "t");
    EXPECT_EQ(0, std::memcmp(x.data(), want.data(), sizeof(float) * size_t(n))) << "bucket " << bucket;
    // Bytes to other ranks: the reduce-scatter sends every piece but its own, the all-gather
    // its own range to each of the N - 1 others (twice each: the two calls above).
    const int64_t own = bounds[size_t(me) + 1] - bounds[size_t(me)];
    const auto& st = g.comm->stats();
    if (N > 1) {
      EXPECT_EQ(st.at("t.reduce_scatter").bytes_sent, 2 * int64_t(sizeof(float)) * (n - own));
      EXPECT_EQ(st.at("t.allgather").bytes_sent, int64_t(sizeof(float)) * own * (N - 1));
    }
    // Integers: exact.
    std::vector<int64_t> c(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) c[size_t(i)] = (int64_t(1) << 40) * (me + 1) + i * (me + 3);
    dp.allreduce_sum_i64(c.data(), n, "c");
    for (int64_t i = 0; i < n; i += 97) {
      int64_t w = 0;
      for (int r = 0; r < N; ++r) w += (int64_t(1) << 40) * (r + 1) + i * (r + 3);
      EXPECT_EQ(c[size_t(i)], w);
    }
    // Variable-size gathers, in rank order.
    std::vector<double> mine(size_t(me + 1), double(me));
    std::vector<size_t> counts;
    const std::vector<double> all = dp.allgatherv(mine.data(), mine.size(), "v", &counts);
    ASSERT_EQ(all.size(), size_t(N * (N + 1) / 2));
    size_t at = 0;
    for (int r = 0; r < N; ++r) {
      EXPECT_EQ(counts[size_t(r)], size_t(r + 1));
      for (int j = 0; j <= r; ++j) EXPECT_EQ(all[at++], double(r));
    }
  }
}

// The progressive reduction (begin_reduce_sum_ordered, dist/ordered_reduction.h) fed ranges in
// a shuffled order (the same on every rank), polled between them, some left for finish():
// bitwise the plain reduce_sum_ordered and the rank-ordered sum, the same bytes, and buckets
// really started before finish().
TEST(DistRanks, ProgressiveReductionInAnyOrderIsThePlainOneBitwise) {
  for (int64_t bucket : {int64_t(64), int64_t(1000), int64_t(4) << 20}) {
    for (bool all : {false, true}) {
      Group g(bucket);
      DataParallel& dp = *g.dp;
      const int N = dp.size(), me = dp.rank();
      const int64_t n = 1237;
      std::vector<int64_t> bounds = uneven_bounds(n, N);
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] = value(me, i);
      std::vector<float> plain = x;
      dp.reduce_sum_ordered(plain.data(), n, bounds, all, "plain");
      // Cut [0, n) into pieces of 1..97 elements, shuffled; the last 3 are never reported.
      std::mt19937 rng(uint32_t(bucket) + (all ? 1 : 0));
      std::vector<std::pair<int64_t, int64_t>> pieces;
      for (int64_t lo = 0; lo < n;) {
        const int64_t hi = std::min(n, lo + 1 + int64_t(rng() % 97));
        pieces.emplace_back(lo, hi);
        lo = hi;
      }
      std::shuffle(pieces.begin(), pieces.end(), rng);
      std::vector<float> prog = x;
      std::unique_ptr<OrderedReduction> red = dp.begin_reduce_sum_ordered(prog.data(), n, bounds, all, "prog");
      for (size_t i = 0; i + 3 < pieces.size(); ++i) {
        red->ready(pieces[i].first, pieces[i].second);
        red->poll();
      }
      red->finish();
      const int64_t lo = all ? 0 : bounds[size_t(me)], hi = all ? n : bounds[size_t(me) + 1];
      EXPECT_EQ(0, std::memcmp(prog.data() + lo, plain.data() + lo, sizeof(float) * size_t(hi - lo)))
          << "bucket " << bucket << " all " << all;
      for (int64_t i = lo; i < hi; ++i) {
        float w = value(0, i);
        for (int r = 1; r < N; ++r) w += value(r, i);
        ASSERT_EQ(prog[size_t(i)], w) << "element " << i << " bucket " << bucket;
      }
      if (N > 1) {
        const auto& st = g.comm->stats();
        EXPECT_EQ(st.at("prog.reduce_scatter").bytes_sent, st.at("plain.reduce_scatter").bytes_sent);
        EXPECT_EQ(st.at("prog.reduce_scatter").calls, st.at("plain.reduce_scatter").calls);
        if (all) {
          EXPECT_EQ(st.at("prog.allgather").bytes_sent, st.at("plain.allgather").bytes_sent);
        }
        EXPECT_EQ(g.dp->overlap_buckets(), (n * 4 + bucket - 1) / bucket);
        if (bucket == 64) {
          EXPECT_GT(g.dp->overlap_buckets_early(), 0);
        }
        EXPECT_LT(g.dp->overlap_buckets_early(), g.dp->overlap_buckets());  // the unreported pieces wait
      }
    }
  }
}

TEST(DistRanks, QuantileBalancingStatisticsAreTheGlobalBatchs) {
  Group g;
  DataParallel& dp = *g.dp;
  const int N = dp.size(), me = dp.rank();
  const int64_t L = 2, E = 8, k = 2, m = 37;
  for (const char* mode : {"qb-hist", "qb-exact", "sign"}) {
    auto make = [&]() -> std::unique_ptr<Balancer> {
      if (std::string(mode) == "sign") return std::make_unique<SignBalancer>(L, E, k, 1e-3);
      QuantileBalancerOptions o;
      o.exact = std::string(mode) == "qb-exact";
      o.bins = 50;
      return std::make_unique<QuantileBalancer>(L, E, k, o);
    };
    auto local = make(), global = make();
    std::vector<std::vector<float>> bl(static_cast<size_t>(L), std::vector<float>(static_cast<size_t>(E)));
    std::vector<std::vector<float>> bg = bl;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < E; ++j) bl[size_t(l)][size_t(j)] = bg[size_t(l)][size_t(j)] = 0.05f * float(j - 3);
    for (int step = 0; step < 3; ++step) {
      for (int r = 0; r < N; ++r) {  // rank r's tokens (every rank generates all of them)
        std::mt19937 rng(uint32_t(1000 * step + r));
        std::uniform_real_distribution<float> u(0.f, 1.f);
        for (int64_t l = 0; l < L; ++l) {
          std::vector<float> s(size_t(m * E));
          for (float& v : s) v = u(rng);
          std::vector<int32_t> idx(size_t(m * k));
          for (int64_t t = 0; t < m; ++t) {  // top-k of s + b
            std::vector<int32_t> o(static_cast<size_t>(E));
            for (int32_t j = 0; j < E; ++j) o[size_t(j)] = j;
            std::partial_sort(o.begin(), o.begin() + k, o.end(), [&](int32_t a, int32_t b) {
              return s[size_t(t * E + a)] + bl[size_t(l)][size_t(a)] > s[size_t(t * E + b)] + bl[size_t(l)][size_t(b)];
            });
            for (int64_t q = 0; q < k; ++q) idx[size_t(t * k + q)] = o[size_t(q)];
          }
          global->observe(l, s.data(), bg[size_t(l)].data(), idx.data(), m);
          if (r == me) local->observe(l, s.data(), bl[size_t(l)].data(), idx.data(), m);
        }
      }
      local->reduce_across(dp);
      std::vector<float*> pl, pg;
      for (int64_t l = 0; l < L; ++l) pl.push_back(bl[size_t(l)].data()), pg.push_back(bg[size_t(l)].data());
      local->update(pl);
      global->update(pg);
      for (int64_t l = 0; l < L; ++l) {
        EXPECT_EQ(0, std::memcmp(bl[size_t(l)].data(), bg[size_t(l)].data(), sizeof(float) * size_t(E)))
            << mode << " step " << step << " layer " << l;
        EXPECT_EQ(local->last_loads()[size_t(l)], global->last_loads()[size_t(l)]) << mode;
      }
      dp.check_identical(bl[0].data(), sizeof(float) * size_t(E), "bias");
    }
  }
}

TEST(DistRanks, DataParallelTrainingEqualsOneProcessBitwise) {
  Group g(int64_t(16) << 10);  // 16 KiB buckets: the tiny model's gradient is many, so most overlap
  DataParallel& dp = *g.dp;
  const int N = dp.size();
  struct Variant {
    bool zero;
    const char* balancer;
    const char* optimizer;
    bool also_without_overlap;  // a second data-parallel run with --dp-overlap off
  };
  for (const Variant& v : {Variant{true, "qb-hist", "muon", true}, Variant{false, "qb-hist", "muon", true},
                           Variant{true, "qb-exact", "adamw", false}}) {
    SharedDir dir(dp);
    const std::string base_name = std::string(v.zero ? "zero1 " : "replicated ") + v.balancer + " " + v.optimizer;
    // Two stages (seq_len 16 then 32) of 3 steps of 256 tokens in 2 micro-batches of 8 and 4
    // sequences: 2 and 1 per rank at 4 ranks. Evaluations every 2 steps, a checkpoint at 4.
    nlohmann::json run = tiny_run();
    run["stages"] = nlohmann::json::parse(R"([
      {"name": "s1", "seq_len": 16, "tokens": 768, "lr_peak": 0.01, "lr_end": 0.01, "warmup_steps": 1},
      {"name": "s2", "seq_len": 32, "tokens": 768, "lr_peak": 0.01, "lr_end": 0.002, "decay_frac": 0.5}])");
    run["eval_every"] = 2, run["eval_tokens"] = 256, run["checkpoint_every"] = 4;
    run["balancer"] = v.balancer, run["optimizer"] = v.optimizer, run["qb_bins"] = 64;
    Trace ref;
    if (dp.rank() == 0) {
      write_run_files(dir.path, run);
      ref = trace_run(dir.path + "/run.json", dir.path + "/ref", N, nullptr, false);  // one process, N threads
    }
    dp.barrier("test.ref");
    // N ranks x 1 thread, the reduction overlapped with the last backward (the default)...
    const int64_t early0 = g.dp->overlap_buckets_early();
    const Trace overlapped = trace_run(dir.path + "/run.json", dir.path + "/dp", 1, &dp, v.zero);
    if (N > 1) {
      EXPECT_GT(g.dp->overlap_buckets_early(), early0) << base_name << ": no bucket started during a backward";
    }
    // ... and after it.
    std::vector<std::pair<std::string, Trace>> runs;
    runs.emplace_back("overlap on", overlapped);
    if (v.also_without_overlap) {
      const int64_t buckets0 = g.dp->overlap_buckets();
      runs.emplace_back("overlap off", trace_run(dir.path + "/run.json", dir.path + "/dp_off", 1, &dp, v.zero, nullptr,
                                                 /*dp_overlap=*/false));
      EXPECT_EQ(g.dp->overlap_buckets(), buckets0) << base_name << ": --dp-overlap off still overlapped";
    }
    if (dp.rank() != 0) continue;
    for (const auto& [how, got] : runs) {
      const std::string name = base_name + ", " + how;
      expect_same_steps(got, ref, name);
      ASSERT_EQ(got.weights.size(), ref.weights.size());
      EXPECT_EQ(0, std::memcmp(got.weights.data(), ref.weights.data(), sizeof(float) * ref.weights.size())) << name;
      EXPECT_TRUE(got.opt_state == ref.opt_state) << name << ": optimiser state";
      EXPECT_FALSE(ref.evals.empty());
      EXPECT_EQ(got.evals, ref.evals) << name;
      EXPECT_EQ(got.ckpt_weights_hash, ref.ckpt_weights_hash) << name;
      EXPECT_EQ(got.ckpt_opt_hash, ref.ckpt_opt_hash) << name;
    }
    // QB moved the router biases (part of the weights compared above).
    const K3Model m = load_model(dir.path + "/dp/checkpoint");
    const float* b = m.weights().param("language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias");
    bool moved = false;
    for (int j = 0; j < 8; ++j) moved |= b[j] != 0.0f;
    EXPECT_TRUE(moved) << base_name;
  }
}

TEST(DistRanks, ExpertParallelLogitsEqualOneProcessBitwise) {
  Group g;
  const int N = g.dp->size();
  LoadOptions lo;
  lo.dense_as_stored = true;
  const K3Model model = load_model(std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny", lo);
  ASSERT_EQ(model.config().num_experts % N, 0);
  set_num_threads(1);
  const std::vector<int32_t> ids = {1, 17, 42, 99, 7, 300, 5, 12, 256, 64, 3, 2};
  auto run = [&]() {
    std::vector<std::vector<float>> out;
    Session s(model);
    const int64_t V = s.vocab();
    const float* l = s.prefill(ids);
    for (int step = 0; step < 5; ++step) {
      out.emplace_back(l, l + V);
      l = s.step(int32_t(std::max_element(l, l + V) - l));
    }
    return out;
  };
  const auto ref = run();
  dist::CommExpertExchange ex(*g.comm);
  set_expert_exchange(&ex);
  const auto got = run();
  set_expert_exchange(nullptr);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_EQ(0, std::memcmp(got[i].data(), ref[i].data(), sizeof(float) * ref[i].size())) << "position " << i;
  if (N > 1) {
    EXPECT_GT(g.comm->stats().at("ep.combine").bytes_sent, 0);
  }
}

}  // namespace k3::test

