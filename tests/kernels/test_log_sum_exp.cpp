// Log-sum-exp over a row of logits (kernels/log_sum_exp.h): the fast path (terms in the row's
// precision) against the all-double reference on rows from one logit to a K3-sized vocabulary,
// with large offsets that overflow an unshifted sum; double rows equal to the reference bit for
// bit; the terms a sampler walks summing to the normaliser exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/log_sum_exp.h"

using namespace k3;

namespace {

std::vector<float> random_row(int64_t V, double spread, double offset, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, spread);
  std::vector<float> x(static_cast<size_t>(V));
  for (float& v : x) v = float(offset + n(rng));
  return x;
}

}  // namespace

TEST(LogSumExp, FastMatchesReference) {
  double worst = 0;
  uint64_t seed = 1;
  auto check = [&](int64_t V, double spread, double offset) {
    const std::vector<float> x = random_row(V, spread, offset, seed++);
    const double fast = log_sum_exp(x.data(), V), ref = log_sum_exp_ref(x.data(), V);
    ASSERT_TRUE(std::isfinite(fast)) << "V " << V << " spread " << spread << " offset " << offset;
    // A float term is within an ulp of e^(x - m), and x - m within half an ulp of itself: the
    // value moves by ~1e-7 times the softmax-weighted |x - m| at most (1.5e-8 measured).
    EXPECT_NEAR(fast, ref, 1e-7 + 1e-14 * std::fabs(ref)) << "V " << V << " spread " << spread << " offset " << offset;
    worst = std::max(worst, std::fabs(fast - ref));
  };
  for (int64_t V : {1, 2, 7, 1000, 65536})
    for (double spread : {0.01, 1.0, 8.0, 40.0})
      for (double offset : {0.0, -3e3, 1e4}) check(V, spread, offset);
  check(163840, 3.0, 20.0);  // a K3-sized vocabulary
  std::printf("log_sum_exp float vs double reference: worst |difference| %.2e\n", worst);
}

TEST(LogSumExp, KnownValuesWithoutOverflow) {
  const float two[2] = {1000.f, 1000.f};  // e^1000 overflows: only the shifted sum survives
  EXPECT_NEAR(log_sum_exp(two, 2), 1000.0 + std::log(2.0), 1e-12);
  const float one[1] = {-7.25f};
  EXPECT_EQ(log_sum_exp(one, 1), -7.25);
  const float far[3] = {0.f, -200.f, 88.f};  // the small terms underflow harmlessly
  EXPECT_NEAR(log_sum_exp(far, 3), 88.0 + std::log1p(std::exp(-88.0)), 1e-12);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const double masked[3] = {neg_inf, 0.5, neg_inf};  // masked logits contribute nothing
  EXPECT_EQ(log_sum_exp(masked, 3), 0.5);
}

TEST(LogSumExp, DoubleRowsAreTheReferenceBitForBit) {
  for (int64_t V : {3, 4097}) {
    const std::vector<float> xf = random_row(V, 5.0, 2.0, uint64_t(V));
    const std::vector<double> x(xf.begin(), xf.end());
    EXPECT_EQ(log_sum_exp(x.data(), V), log_sum_exp_ref(x.data(), V)) << V;
  }
}

TEST(LogSumExp, SamplerTermsSumToTheNormaliser) {
  // posttrain/rollout.cpp draws by walking exp_term until the running sum passes u * sum: the
  // walk must reach the normaliser's own sum at the end (else the last token is never drawn
  // or is drawn for u near 1).
  const int64_t V = 50000;
  const std::vector<float> x = random_row(V, 6.0, -1.0, 99);
  const LogSumExpParts<float> p = log_sum_exp_parts(x.data(), V);
  double acc = 0;
  for (int64_t v = 0; v < V; ++v) acc += exp_term(x[size_t(v)], p.max);
  EXPECT_EQ(acc, p.sum);
  EXPECT_EQ(p.value(), log_sum_exp(x.data(), V));
  EXPECT_EQ(p.max, *std::max_element(x.begin(), x.end()));
}
