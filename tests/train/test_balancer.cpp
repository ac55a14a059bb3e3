// Quantile Balancing (docs/model.md section 6): micro-batch additivity, histogram accuracy,
// and that one update balances the batch it was computed from; sign update direction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "train/balancer.h"

using namespace k3;

namespace {

// Skewed sigmoid router scores: expert popularity varies a lot, so b = 0 is far from balanced.
std::vector<float> skewed_scores(int64_t m, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> pop(static_cast<size_t>(E));
  for (auto& p : pop) p = 1.5f * n(rng);
  std::vector<float> s(static_cast<size_t>(m * E));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < E; ++j) s[i * E + j] = 1.0f / (1.0f + std::exp(-(pop[j] + n(rng))));
  return s;
}

// top_k(s + b), lower index wins ties (the router's rule).
std::vector<int32_t> route(const std::vector<float>& s, const std::vector<float>& b, int64_t m, int64_t E, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(m * k)), order(static_cast<size_t>(E));
  for (int64_t i = 0; i < m; ++i) {
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t c) {
      float va = s[i * E + a] + b[a], vc = s[i * E + c] + b[c];
      return va > vc || (va == vc && a < c);
    });
    std::copy(order.begin(), order.begin() + k, idx.begin() + i * k);
  }
  return idx;
}

double maxvio_of(const std::vector<int32_t>& idx, int64_t m, int64_t E, int64_t k) {
  std::vector<int64_t> loads(static_cast<size_t>(E), 0);
  count_loads(loads.data(), idx.data(), m, k, E);
  return max_violation(loads.data(), E);
}

}  // namespace

TEST(QuantileBalancer, MicroBatchesEqualOneGlobalBatch) {
  const int64_t E = 64, k = 4, B = 256;
  auto s = skewed_scores(4 * B, E, 1);
  std::vector<float> b0(static_cast<size_t>(E), 0.0f);
  for (int64_t j = 0; j < E; ++j) b0[j] = 0.01f * float(j % 7) - 0.03f;
  auto idx = route(s, b0, 4 * B, E, k);
  for (bool exact : {true, false}) {
    QuantileBalancer one(1, E, k, {exact, 1000}), four(1, E, k, {exact, 1000});
    one.observe(0, s.data(), b0.data(), idx.data(), 4 * B);
    for (int mb = 0; mb < 4; ++mb) four.observe(0, s.data() + mb * B * E, b0.data(), idx.data() + mb * B * k, B);
    std::vector<float> b1 = b0, b4 = b0;
    one.update({b1.data()});
    four.update({b4.data()});
    for (int64_t j = 0; j < E; ++j) EXPECT_EQ(b1[j], b4[j]) << (exact ? "exact " : "hist ") << j;
    EXPECT_EQ(one.last_loads()[0], four.last_loads()[0]);
  }
}

TEST(QuantileBalancer, HistogramWithinOneBinOfExact) {
  const int64_t E = 96, k = 8, m = 2000;
  auto s = skewed_scores(m, E, 2);
  std::vector<float> b(static_cast<size_t>(E), 0.0f);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.2f, 0.3f);
  for (auto& v : b) v = u(rng);
  auto idx = route(s, b, m, E, k);
  const int64_t bins = 1000;
  QuantileBalancer ex(1, E, k, {true, bins}), hi(1, E, k, {false, bins});
  ex.observe(0, s.data(), b.data(), idx.data(), m);
  hi.observe(0, s.data(), b.data(), idx.data(), m);
  const double width = ((*std::max_element(b.begin(), b.end()) + 1.0) - (*std::min_element(b.begin(), b.end()) - 1.0)) / bins;
  for (int64_t j = 0; j < E; ++j)
    EXPECT_LE(std::fabs(ex.next_bias_uncentred(0, j) - hi.next_bias_uncentred(0, j)), width) << j;
}

// What one update guarantees: at the cutoffs alpha_i it was computed from (the (k+1)-th
// largest s_i + b with the bias in force), the new (uncentred) bias b' puts m k / E tokens of
// the batch above the cutoff for every expert, #{i : s_ij + b'_j > alpha_i} = 256 here, up to
// the ties at the quantile: every token whose cutoff is expert j itself has the same negated
// margin alpha_i - s_ij = b_j, so the tokens at the quantile's value all fall one side (the
// tie granularity: about m / E = 64 tokens per expert here). Centring shifts every expert
// alike, so it does not change a top-k selection. Re-routing moves the cutoffs themselves,
// which the next test shows.
TEST(QuantileBalancer, OneUpdateBalancesTheBatchAtItsCutoffsToTheTies) {
  const int64_t E = 64, k = 4, m = 4096, target = m * k / E;
  auto s = skewed_scores(m, E, 3);
  for (bool exact : {true, false}) {
    std::vector<float> b(static_cast<size_t>(E), 0.0f);
    for (int64_t j = 0; j < E; ++j) b[j] = 0.02f * float(j % 5) - 0.04f;
    const auto idx = route(s, b, m, E, k);
    QuantileBalancer qb(1, E, k, {exact, 1000});
    qb.observe(0, s.data(), b.data(), idx.data(), m);
    std::vector<float> alpha(static_cast<size_t>(m)), sb(static_cast<size_t>(E));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < E; ++j) sb[j] = s[i * E + j] + b[j];
      std::nth_element(sb.begin(), sb.begin() + k, sb.end(), std::greater<float>());
      alpha[i] = sb[k];
    }
    // Histogram: the quantile is read within one bin (width (max b - min b + 2) / 1000), so
    // the tokens whose negated margin shares its bin count as ties too.
    const double tie_width = exact ? 0.0 : (0.16 + 2.0) / 1000;  // one bin either side
    int64_t worst_gap = 0, max_ties = 0;
    for (int64_t j = 0; j < E; ++j) {
      const double v = qb.next_bias_uncentred(0, j);
      int64_t below = 0, ties = 0;  // negated margins below v, and at v (within the bin)
      for (int64_t i = 0; i < m; ++i) {
        const double neg_r = double(alpha[i] - s[i * E + j]);  // the balancer's float margin
        if (std::abs(neg_r - v) <= tie_width + 1e-7) ++ties;
        else if (neg_r < v) ++below;
      }
      EXPECT_LE(below, target) << "expert " << j;
      EXPECT_GE(below + ties, target) << "expert " << j;
      worst_gap = std::max(worst_gap, target - below);
      max_ties = std::max(max_ties, ties);
    }
    std::printf("%s: tokens above the cutoff = %ld minus at most %ld (largest tie group %ld)\n",
                exact ? "exact" : "histogram", long(target), long(worst_gap), long(max_ties));
  }
}

// One update treats each token's cutoff alpha_i as fixed, so it removes most but not all of
// the imbalance of the batch it saw (measured: MaxVio 13.3 -> 0.61 here); repeating it on the
// same batch converges to balance within the tie granularity (1 token = 1/256 of the mean).
TEST(QuantileBalancer, UpdatesBalanceTheBatchTheySaw) {
  const int64_t E = 64, k = 4, m = 4096;
  auto s = skewed_scores(m, E, 3);
  std::vector<float> b(static_cast<size_t>(E), 0.0f);
  auto idx = route(s, b, m, E, k);
  const double before = maxvio_of(idx, m, E, k);
  double after1 = 0, after = 0;
  for (int it = 0; it < 30; ++it) {
    QuantileBalancer qb(1, E, k, {true, 1000});
    qb.observe(0, s.data(), b.data(), idx.data(), m);
    qb.update({b.data()});
    idx = route(s, b, m, E, k);
    after = maxvio_of(idx, m, E, k);
    if (it == 0) after1 = after;
  }
  std::printf("MaxVio on the batch: before %.3f, after 1 QB update %.3f, after 30 %.4f\n", before, after1, after);
  EXPECT_GT(before, 5.0);
  EXPECT_LT(after1, before / 10);
  EXPECT_LE(after, 8.0 / 256);  // within a few tokens of the mean load of 256
}

TEST(SignBalancer, MovesBiasTowardUnderloadedExperts) {
  const int64_t E = 8, k = 2, m = 100;
  std::vector<int32_t> idx(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) { idx[i * k] = 0; idx[i * k + 1] = int32_t(1 + i % 7); }
  SignBalancer sb(1, E, k, 1e-3);
  std::vector<float> b(static_cast<size_t>(E), 0.0f);
  sb.observe(0, nullptr, b.data(), idx.data(), m);
  sb.update({b.data()});
  EXPECT_FLOAT_EQ(b[0], -1e-3f);  // overloaded: pushed down
  for (int64_t j = 1; j < E; ++j) EXPECT_FLOAT_EQ(b[j], 1e-3f);  // 14-15 tokens < mean 25
}
