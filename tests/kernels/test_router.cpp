// Router: fixture ops/router.json (selection with the correction bias, weights from the
// unbiased scores, renormalised), deterministic ties, double == float.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/fixture.h"
#include "kernels/activations.h"
#include "kernels/router.h"

using namespace k3;

TEST(Router, MatchesFixture) {
  test::Fixture fx("ops/router.json");
  auto W = fx.tensor("gate_weight"), b = fx.tensor("bias"), x = fx.tensor("in");
  auto want_idx = fx.tensor("topk_idx"), want_w = fx.tensor("topk_weight");
  const int64_t E = W.shape[0], d = W.shape[1], T = x.shape[0], k = int64_t(fx.num("top_k"));
  ASSERT_EQ(E, int64_t(fx.num("n_experts")));
  std::vector<int32_t> idx(T * k);
  std::vector<float> w(T * k), s(T * E);
  router_forward<float>(idx.data(), w.data(), s.data(), x.data.data(), W.data.data(), b.data.data(), T, d, E, k, true,
                        1.0);
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(idx[i], int32_t(want_idx.data[i])) << "slot " << i;
  test::expect_close(w, want_w, 1e-5, 1e-4, "topk_weight");
  // Saved scores are the unbiased sigmoid.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double z = 0;
      for (int64_t c = 0; c < d; ++c) z += double(W.data[e * d + c]) * x.data[t * d + c];
      EXPECT_NEAR(s[t * E + e], 1 / (1 + std::exp(-z)), 1e-6);
    }
}

// The fixture is adversarial: without the bias the selection changes in the rows it says.
TEST(Router, FixtureBiasChangesSelection) {
  test::Fixture fx("ops/router.json");
  auto W = fx.tensor("gate_weight"), x = fx.tensor("in"), want_idx = fx.tensor("topk_idx");
  const int64_t E = W.shape[0], d = W.shape[1], T = x.shape[0], k = int64_t(fx.num("top_k"));
  std::vector<int32_t> idx(T * k);
  std::vector<float> w(T * k), s(T * E);
  router_forward<float>(idx.data(), w.data(), s.data(), x.data.data(), W.data.data(), nullptr, T, d, E, k, true, 1.0);
  int changed = 0;
  for (int64_t t = 0; t < T; ++t) {
    bool same = true;
    for (int64_t i = 0; i < k; ++i) same = same && idx[t * k + i] == int32_t(want_idx.data[t * k + i]);
    changed += !same;
  }
  EXPECT_EQ(changed, int(fx.num("rows_where_bias_changed_selection")));
}

TEST(Router, TiesGoToLowerIndexAndNaNRanksLast) {
  const float s[6] = {0.5f, 0.7f, NAN, 0.7f, 0.5f, 0.7f};
  int32_t idx[4];
  router_select_topk<float>(idx, s, nullptr, 6, 4);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 5);
  EXPECT_EQ(idx[3], 0);
  // The bias reorders: expert 4 gets ahead of everyone.
  const float b[6] = {0, 0, 0, 0, 0.3f, 0};
  router_select_topk<float>(idx, s, b, 6, 2);
  EXPECT_EQ(idx[0], 4);
  EXPECT_EQ(idx[1], 1);
  // All NaN: still a total order, lowest indices first.
  const float n[3] = {NAN, NAN, NAN};
  router_select_topk<float>(idx, n, nullptr, 3, 2);
  EXPECT_EQ(idx[0], 0);
  EXPECT_EQ(idx[1], 1);
}

TEST(Router, NoRenormScalesUnbiasedScoresAndDoubleMatchesFloat) {
  const int64_t T = 7, d = 16, E = 12, k = 3;
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0, 1);
  std::vector<double> x(T * d), W(E * d), b(E);
  for (auto& v : x) v = nd(rng);
  for (auto& v : W) v = nd(rng) * 0.3;
  for (auto& v : b) v = nd(rng) * 0.1;
  std::vector<float> xf(x.begin(), x.end()), Wf(W.begin(), W.end()), bf(b.begin(), b.end());
  std::vector<int32_t> id(T * k), if_(T * k);
  std::vector<double> wd(T * k), sd(T * E);
  std::vector<float> wf(T * k), sf(T * E);
  router_forward<double>(id.data(), wd.data(), sd.data(), x.data(), W.data(), b.data(), T, d, E, k, false, 2.5);
  router_forward<float>(if_.data(), wf.data(), sf.data(), xf.data(), Wf.data(), bf.data(), T, d, E, k, false, 2.5);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = id[t * k + i];
      EXPECT_EQ(e, if_[t * k + i]);
      EXPECT_DOUBLE_EQ(wd[t * k + i], 2.5 * sd[t * E + e]);  // unbiased, not renormalised
      EXPECT_NEAR(wf[t * k + i], wd[t * k + i], 1e-5);
      if (i > 0) {
        EXPECT_GE(sd[t * E + id[t * k + i - 1]] + b[id[t * k + i - 1]], sd[t * E + e] + b[e]);
      }
    }
}
