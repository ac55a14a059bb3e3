// Held-out routing statistics (train/routing_eval.h):
//  - accumulate_routing counts valid slots only (out-of-range, duplicated and zero-weight
//    slots are dropped) and overflow_slots follows ceil(cf * mean) capacities, on hand-made
//    routings;
//  - random routing gives k distinct experts per token, is seeded, and its MaxVio falls with
//    the number of tokens;
//  - evaluate_heldout on a tiny random model (first layer dense, 3 MoE layers of 8 experts
//    top-2): the loss equals model_grad's eval_loss_sum over the same windows; per layer the
//    loads, within-window MaxVio, zero-load count and overflow equal a recomputation from an
//    independent forward of each window; no slot is dropped; 1 and 2 threads give identical
//    figures; max_tokens takes a prefix; a stream shorter than a window is an error;
//  - Moving QB (train/moving_qb.h): chunk 0 is the static selection; routing is causal (later
//    scores never change earlier chunks); the histogram path agrees with the exact weighted-
//    quantile reference; on sequences with persistent per-sequence preferences it cuts the
//    within-sequence MaxVio; evaluate_heldout's moving figures are those of moving_qb_route
//    on the recorded scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "io/config.h"
#include "kernels/router.h"
#include "model/init.h"
#include "train/balancer.h"
#include "train/model_grad.h"
#include "train/moving_qb.h"
#include "train/routing_eval.h"

using namespace k3;

namespace {

K3Config eval_config() {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.hidden_size = 32;
  c.num_hidden_layers = 4;
  c.vocab_size = 40;
  c.kda_num_heads = 2;
  c.kda_head_dim = 8;
  c.full_attn_layers = {4};
  c.kda_layers = {1, 2, 3};
  c.num_attention_heads = 2;
  c.q_lora_rank = 16;
  c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 8;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.routed_expert_hidden_size = 16;
  c.moe_intermediate_size = 8;
  c.first_k_dense_replace = 1;
  c.intermediate_size = 16;
  c.attn_res_block_size = 2;
  validate_config(c, "eval_config");
  return c;
}

// Init with a large std so that the routing is far from uniform (some experts idle).
K3Model eval_model() { return K3Model(init_weights(eval_config(), {5, ExpertStorage::Plain, 0.5})); }

std::vector<int32_t> tokens(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(V));
  return t;
}

struct Threads {
  explicit Threads(int n) { set_num_threads(n); }
  ~Threads() { set_num_threads(0); }
};

}  // namespace

TEST(RoutingEval, AccumulateCountsOnlyValidSlots) {
  // 4 tokens, k = 3, E = 5.
  const int32_t idx[] = {0, 1, 2,    // valid
                         3, 3, 4,    // duplicate: one slot lost
                         4, 7, -1,   // two out of range
                         1, 2, 0};   // valid, but one zero weight
  const float w[] = {.5f, .3f, .2f, .4f, .4f, .2f, 1.f, 0.f, 0.f, .6f, 0.f, .4f};
  std::vector<int64_t> loads(5, 0);
  EXPECT_EQ(accumulate_routing(loads.data(), idx, w, 4, 3, 5), 3 + 2 + 1 + 2);
  EXPECT_EQ(loads, (std::vector<int64_t>{2, 2, 1, 1, 2}));
  std::vector<int64_t> no_w(5, 0);
  EXPECT_EQ(accumulate_routing(no_w.data(), idx, nullptr, 4, 3, 5), 3 + 2 + 1 + 3);
  EXPECT_EQ(no_w, (std::vector<int64_t>{2, 2, 2, 1, 2}));
}

TEST(RoutingEval, OverflowUsesCeilCapacity) {
  const int64_t loads[] = {10, 0, 3, 3};  // total 16, mean 4
  EXPECT_EQ(overflow_slots(loads, 4, 1.0), 6);   // capacity 4: 10 - 4
  EXPECT_EQ(overflow_slots(loads, 4, 1.25), 5);  // capacity 5
  EXPECT_EQ(overflow_slots(loads, 4, 3.0), 0);   // capacity 12
  const int64_t even[] = {4, 4, 4, 4};
  EXPECT_EQ(overflow_slots(even, 4, 1.0), 0);
}

TEST(RoutingEval, RandomRoutingIsDistinctSeededAndAverages) {
  const int64_t E = 64, k = 8;
  std::vector<int64_t> a(E), b(E), c(E);
  random_routing_loads(a.data(), 1, k, E, 3);  // one token: k distinct experts
  EXPECT_EQ(std::count(a.begin(), a.end(), 1), k);
  EXPECT_EQ(std::count(a.begin(), a.end(), 0), E - k);
  random_routing_loads(a.data(), 500, k, E, 9);
  random_routing_loads(b.data(), 500, k, E, 9);
  random_routing_loads(c.data(), 500, k, E, 10);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int64_t sum = 0;
  for (int64_t x : a) {
    sum += x;
    EXPECT_LE(x, 500);
  }
  EXPECT_EQ(sum, 500 * k);
  const RandomRoutingBaseline r = random_routing_baseline(20000, 50, 2000, k, E);
  EXPECT_GT(r.seq_maxvio, r.batch_maxvio);  // fewer tokens: larger relative fluctuations
  EXPECT_GT(r.batch_maxvio, r.maxvio);
  EXPECT_GT(r.maxvio, 0.0);
  EXPECT_LT(r.maxvio, 0.2);  // 20000 * 8 / 64 = 2500 per expert: a few percent
  EXPECT_GE(r.overflow_cf1, r.overflow_cf125);
}

TEST(RoutingEval, HeldoutMatchesIndependentRecomputation) {
  const K3Model model = eval_model();
  const int64_t T = 24, E = 8, k = 2, n_windows = 7;
  const std::vector<int32_t> stream = tokens(n_windows * T + 5, 40, 11);  // 7 windows fit, a remainder
  HeldoutEval r;
  {
    const Threads two(2);
    r = evaluate_heldout(model, stream, T, 0, 3 * T);  // batches of 3 windows (2 full, 1 partial left out)
  }
  ASSERT_EQ(r.windows, n_windows);
  EXPECT_EQ(r.targets, n_windows * T);
  EXPECT_EQ(r.batch_tokens, 3 * T);
  ASSERT_EQ(r.layers.size(), 3u);

  // Independent path: eval_loss_sum per window (model_grad.h) and a forward with a record.
  auto s = make_train_scratch();
  double nats = 0;
  int64_t bytes = 0;
  std::vector<std::vector<int64_t>> loads(3, std::vector<int64_t>(E, 0)), batch(3, std::vector<int64_t>(E, 0));
  std::vector<double> seq_sum(3, 0), seq_max(3, 0), over1(3, 0), over125(3, 0);
  for (int64_t w = 0; w < n_windows; ++w) {
    const int32_t* ids = stream.data() + w * T;
    nats += eval_loss_sum(model, ids, T, *s);
    for (int64_t t = 1; t <= T; ++t) bytes += ids[t] < 256;
    DecodeState st = model.new_state();
    ForwardScratch fs;
    ForwardRecord rec;
    std::vector<float> logits(size_t(T * model.dims().V));
    model.forward(logits.data(), ids, T, st, fs, {}, &rec);
    for (int l = 0; l < 3; ++l) {
      std::vector<int64_t> one(E, 0);
      count_loads(one.data(), rec.layers[size_t(1 + l)].moe.routing.idx.data(), T, k, E);
      for (int64_t j = 0; j < E; ++j) loads[l][j] += one[j], batch[l][j] += one[j];
      const double mv = max_violation(one.data(), E);
      seq_sum[l] += mv;
      seq_max[l] = std::max(seq_max[l], mv);
      if ((w + 1) % 3 == 0) {
        over1[l] += double(overflow_slots(batch[l].data(), E, 1.0));
        over125[l] += double(overflow_slots(batch[l].data(), E, 1.25));
        std::fill(batch[l].begin(), batch[l].end(), 0);
      }
    }
  }
  EXPECT_NEAR(r.loss, nats / double(n_windows * T), 1e-6 * std::abs(r.loss));
  EXPECT_EQ(r.bytes, bytes);
  bool some_imbalance = false;
  for (int l = 0; l < 3; ++l) {
    const LayerRoutingStats& L = r.layers[size_t(l)];
    EXPECT_EQ(L.layer, 1 + l);
    EXPECT_EQ(L.loads, loads[l]);
    EXPECT_EQ(L.tokens, n_windows * T);
    EXPECT_EQ(L.slots, n_windows * T * k);
    EXPECT_EQ(L.dropped, 0);
    EXPECT_DOUBLE_EQ(L.maxvio, max_violation(loads[l].data(), E));
    EXPECT_EQ(L.zero_experts, std::count(loads[l].begin(), loads[l].end(), 0));
    EXPECT_NEAR(L.seq_maxvio_mean, seq_sum[l] / double(n_windows), 1e-12);
    EXPECT_DOUBLE_EQ(L.seq_maxvio_max, seq_max[l]);
    EXPECT_NEAR(L.overflow_cf1, over1[l] / double(2 * 3 * T * k), 1e-12);
    EXPECT_NEAR(L.overflow_cf125, over125[l] / double(2 * 3 * T * k), 1e-12);
    some_imbalance |= L.maxvio > 0.2;
  }
  EXPECT_TRUE(some_imbalance) << "the test model should route unevenly, or the figures test nothing";

  // One thread: the same figures, bit for bit.
  HeldoutEval r1;
  {
    const Threads one(1);
    r1 = evaluate_heldout(model, stream, T, 0, 3 * T);
  }
  EXPECT_EQ(r1.loss, r.loss);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(r1.layers[size_t(l)].loads, r.layers[size_t(l)].loads);
    EXPECT_EQ(r1.layers[size_t(l)].seq_maxvio_mean, r.layers[size_t(l)].seq_maxvio_mean);
  }

  // A prefix: max_tokens 2T + 1 -> 3 windows.
  const HeldoutEval p = evaluate_heldout(model, stream, T, 2 * T + 1, 4096);
  EXPECT_EQ(p.windows, 3);
  EXPECT_EQ(p.batch_tokens, 3 * T);  // clamped to the windows there are

  // Too short for one window.
  EXPECT_THROW(evaluate_heldout(model, std::vector<int32_t>(T, 1), T), Error);
}

namespace {

// Sigmoid scores [T, E] of one sequence: a global expert offset (what the global bias
// cancels), a per-sequence preference (what only sequence-level balancing can cancel) and
// per-token noise.
std::vector<float> sequence_scores(int64_t T, int64_t E, const std::vector<float>& global, uint32_t seed, double pref) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> seq(static_cast<size_t>(E)), s(static_cast<size_t>(T * E));
  for (auto& x : seq) x = float(pref) * nd(rng);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < E; ++j)
      s[size_t(t * E + j)] = 1.f / (1.f + std::exp(-(global[size_t(j)] + seq[size_t(j)] + 0.5f * nd(rng))));
  return s;
}

double routing_maxvio(const std::vector<int32_t>& idx, int64_t T, int64_t k, int64_t E) {
  std::vector<int64_t> loads(static_cast<size_t>(E), 0);
  count_loads(loads.data(), idx.data(), T, k, E);
  return max_violation(loads.data(), E);
}

}  // namespace

TEST(MovingQB, FirstChunkStaticCausalAndMatchesReference) {
  const int64_t T = 256, E = 64, k = 4;
  std::vector<float> global(E, 0.f), b(E, 0.f);
  const std::vector<float> s = sequence_scores(T, E, global, 1, 0.7);
  MovingQBOptions o;
  o.chunk = 32;
  MovingQBScratch ws;
  std::vector<int32_t> idx(size_t(T * k)), ref(size_t(T * k)), stat(size_t(T * k));
  moving_qb_route(idx.data(), s.data(), b.data(), T, E, k, o, ws);
  moving_qb_route_ref(ref.data(), s.data(), b.data(), T, E, k, o, ws);
  for (int64_t t = 0; t < T; ++t) router_select_topk(stat.data() + t * k, s.data() + t * E, b.data(), E, k);
  // Chunk 0 is routed with the global bias.
  EXPECT_TRUE(std::equal(idx.begin(), idx.begin() + o.chunk * k, stat.begin()));
  // Later chunks differ from the static routing (the bias moved) ...
  EXPECT_FALSE(std::equal(idx.begin() + o.chunk * k, idx.end(), stat.begin() + o.chunk * k));
  // ... and agree with the exact reference up to histogram resolution.
  int64_t same = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < k; ++i)
      same += std::count(ref.begin() + t * k, ref.begin() + t * k + k, idx[size_t(t * k + i)]);
  EXPECT_GE(double(same) / double(T * k), 0.97);
  // Causal: changing the scores from position 3C on changes nothing before it.
  std::vector<float> s2 = s;
  for (size_t i = size_t(3 * o.chunk * E); i < s2.size(); ++i) s2[i] = 1.f - s2[i];
  std::vector<int32_t> idx2(size_t(T * k));
  moving_qb_route(idx2.data(), s2.data(), b.data(), T, E, k, o, ws);
  EXPECT_TRUE(std::equal(idx.begin(), idx.begin() + 3 * o.chunk * k, idx2.begin()));
  EXPECT_FALSE(std::equal(idx.begin() + 3 * o.chunk * k, idx.end(), idx2.begin() + 3 * o.chunk * k));
}

TEST(MovingQB, CutsWithinSequenceImbalance) {
  const int64_t T = 512, E = 64, k = 4;
  // Global offsets cancelled by a global bias: b = -offset keeps the batch balanced on average.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> global(E), b(E);
  for (int64_t j = 0; j < E; ++j) global[size_t(j)] = 0.3f * nd(rng), b[size_t(j)] = 0.f;
  MovingQBOptions o;
  MovingQBScratch ws;
  double stat_mv = 0, mqb_mv = 0;
  const int n = 6;
  for (int q = 0; q < n; ++q) {
    const std::vector<float> s = sequence_scores(T, E, global, 10 + q, 0.8);
    std::vector<int32_t> idx(size_t(T * k)), stat(size_t(T * k));
    for (int64_t t = 0; t < T; ++t) router_select_topk(stat.data() + t * k, s.data() + t * E, b.data(), E, k);
    moving_qb_route(idx.data(), s.data(), b.data(), T, E, k, o, ws);
    stat_mv += routing_maxvio(stat, T, k, E) / n;
    mqb_mv += routing_maxvio(idx, T, k, E) / n;
  }
  EXPECT_GT(stat_mv, 2.0) << "the synthetic sequences should be imbalanced";
  EXPECT_LT(mqb_mv, 0.6 * stat_mv);
}

TEST(MovingQB, HeldoutFiguresAreThoseOfTheRecordedScores) {
  const K3Model model = eval_model();
  const int64_t T = 40, E = 8, k = 2;
  const std::vector<int32_t> stream = tokens(3 * T + 1, 40, 4);
  MovingQBOptions o;
  o.chunk = 8;
  const HeldoutEval r = evaluate_heldout(model, stream, T, 0, T, &o);
  ASSERT_EQ(r.moving.size(), 3u);
  std::vector<int64_t> loads(E, 0);
  for (int64_t w = 0; w < 3; ++w) {
    DecodeState st = model.new_state();
    ForwardScratch fs;
    ForwardRecord rec;
    std::vector<float> logits(size_t(T * model.dims().V));
    model.forward(logits.data(), stream.data() + w * T, T, st, fs, {}, &rec);
    MovingQBScratch ws;
    std::vector<int32_t> idx(size_t(T * k));
    moving_qb_route(idx.data(), rec.layers[1].moe.routing.scores.data(), model.layer(1).moe.router_bias, T, E, k, o, ws);
    count_loads(loads.data(), idx.data(), T, k, E);
  }
  EXPECT_EQ(r.moving[0].loads, loads);
  EXPECT_EQ(r.moving[0].layer, 1);
  for (const LayerRoutingStats& s : r.moving) EXPECT_EQ(s.dropped, 0);
}
