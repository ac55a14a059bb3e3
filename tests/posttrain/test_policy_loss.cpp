// The RL objectives (posttrain/policy_loss.h) against hand computations on a toy batch, and
// their dL/dlogp against central finite differences in double.
#include <gtest/gtest.h>

#include <cmath>

#include "posttrain/policy_loss.h"

using namespace k3;

namespace {

LossSample sample(int64_t group, double reward, std::vector<double> log_ratio, std::vector<uint8_t> mask = {}) {
  LossSample s;
  s.group = group, s.reward = reward;
  for (double lr : log_ratio) {
    s.behav_logp.push_back(-1.0 - 0.1 * double(s.logp.size()));
    s.logp.push_back(s.behav_logp.back() + lr);
  }
  s.mask = mask.empty() ? std::vector<uint8_t>(log_ratio.size(), 1) : mask;
  return s;
}

double fd_check(std::vector<LossSample> s, const PolicyLossOptions& o) {
  std::vector<std::vector<double>> g, tmp;
  policy_loss(s, o, g);
  double worst = 0;
  const double h = 1e-6;
  for (size_t i = 0; i < s.size(); ++i)
    for (size_t t = 0; t < s[i].logp.size(); ++t) {
      const double v = s[i].logp[t];
      s[i].logp[t] = v + h;
      const double lp = policy_loss(s, o, tmp).loss;
      s[i].logp[t] = v - h;
      const double lm = policy_loss(s, o, tmp).loss;
      s[i].logp[t] = v;
      worst = std::max(worst, std::fabs((lp - lm) / (2 * h) - g[i][t]));
    }
  return worst;
}

}  // namespace

TEST(PolicyLoss, DapoHandComputed) {
  // Group 0: rewards 1, 0, 0.5 -> mean 0.5, A = 0.5, -0.5, 0. Group 1: rewards 1, 1 (no variance).
  std::vector<LossSample> s = {
      sample(0, 1.0, {std::log(1.1), std::log(1.3)}),   // A > 0: 1.1 live, 1.3 > 1.28 clipped
      sample(0, 0.0, {std::log(0.85), std::log(0.7)}),  // A < 0: 0.85 live, 0.7 < 0.8 clipped
      sample(0, 0.5, {0.0, 0.0}),
      sample(1, 1.0, {0.3}),
      sample(1, 1.0, {-0.3}),
  };
  PolicyLossOptions o;  // dapo, 0.2 / 0.28
  std::vector<std::vector<double>> g;
  const PolicyLossResult r = policy_loss(s, o, g);
  EXPECT_EQ(r.kept, 3);
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(r.tokens, 6);
  EXPECT_EQ(r.clipped, 2);
  EXPECT_NEAR(r.advantage[0], 0.5, 1e-15);
  EXPECT_NEAR(r.advantage[1], -0.5, 1e-15);
  EXPECT_EQ(r.advantage[3], 0.0);
  // L = -(1/6) [0.5*1.1 + 0.5*1.28 - 0.5*0.85 - 0.5*0.8 + 0 + 0] = -0.365 / 6
  EXPECT_NEAR(r.loss, -0.365 / 6.0, 1e-12);
  EXPECT_NEAR(g[0][0], -0.5 * 1.1 / 6.0, 1e-12);
  EXPECT_EQ(g[0][1], 0.0);
  EXPECT_NEAR(g[1][0], 0.5 * 0.85 / 6.0, 1e-12);
  EXPECT_EQ(g[1][1], 0.0);
  EXPECT_EQ(g[2][0], 0.0);
  EXPECT_EQ(g[3][0], 0.0);  // dropped group
  EXPECT_EQ(g[4][0], 0.0);
}

TEST(PolicyLoss, AsymmetricClipBoundaries) {
  // rho just inside / outside 1 + 0.28 (A > 0) and 1 - 0.2 (A < 0).
  std::vector<LossSample> s = {sample(0, 1.0, {std::log(1.27), std::log(1.29), std::log(0.79)}),
                               sample(0, 0.0, {std::log(0.81), std::log(0.79), std::log(1.5)})};
  std::vector<std::vector<double>> g;
  const PolicyLossResult r = policy_loss(s, {}, g);
  EXPECT_NE(g[0][0], 0.0);
  EXPECT_EQ(g[0][1], 0.0);
  EXPECT_NE(g[0][2], 0.0);  // A > 0 and rho below 1 - eps: the unclipped branch is the minimum
  EXPECT_NE(g[1][0], 0.0);
  EXPECT_EQ(g[1][1], 0.0);
  EXPECT_NE(g[1][2], 0.0);  // A < 0 and rho above 1 + eps: unclipped (pessimistic) branch
  EXPECT_EQ(r.clipped, 2);
  // Truncated IS: rho above is_cap has no gradient even where the clip would keep it.
  std::vector<LossSample> t = {sample(0, 0.0, {std::log(6.0)}), sample(0, 1.0, {0.0})};
  policy_loss(t, {}, g);
  EXPECT_EQ(g[0][0], 0.0);
}

TEST(PolicyLoss, MirrorDescentHandComputed) {
  PolicyLossOptions o;
  o.kind = RLLossKind::mirror;
  o.tau = 0.5;
  // A = 0.5, -0.5; Delta = 0.3 and -0.1 (second token masked); e = 0.35, -0.45.
  std::vector<LossSample> s = {sample(0, 1.0, {0.1, 0.2}), sample(0, 0.0, {-0.1, 7.0}, {1, 0})};
  std::vector<std::vector<double>> g;
  const PolicyLossResult r = policy_loss(s, o, g);
  EXPECT_NEAR(r.loss, (0.35 * 0.35 + 0.45 * 0.45) / 2.0, 1e-12);
  EXPECT_NEAR(g[0][0], -0.175, 1e-12);
  EXPECT_NEAR(g[0][1], -0.175, 1e-12);
  EXPECT_NEAR(g[1][0], 0.225, 1e-12);
  EXPECT_EQ(g[1][1], 0.0);
}

TEST(PolicyLoss, GradientsMatchFiniteDifferences) {
  std::vector<LossSample> s = {sample(0, 1.0, {0.05, -0.1, 0.12}), sample(0, 0.0, {0.02, 0.3, -0.05}),
                               sample(0, 0.25, {-0.04, 0.01, 0.0}, {1, 0, 1}), sample(1, 0.0, {0.1}),
                               sample(1, 1.0, {-0.1})};
  for (auto& x : s) x.ref_logp = x.logp, x.ref_logp[0] -= 0.2;
  PolicyLossOptions o;
  o.kl_coef = 0.1;
  o.std_norm = true;
  EXPECT_LT(fd_check(s, o), 1e-8);
  o.kind = RLLossKind::mirror;
  EXPECT_LT(fd_check(s, o), 1e-8);
}

TEST(PolicyLoss, KlTermIsZeroAtTheReference) {
  std::vector<LossSample> s = {sample(0, 1.0, {0.0}), sample(0, 0.0, {0.0})};
  for (auto& x : s) x.ref_logp = x.logp;
  PolicyLossOptions o;
  o.kl_coef = 1.0;
  std::vector<std::vector<double>> g;
  const PolicyLossResult r = policy_loss(s, o, g);
  EXPECT_EQ(r.kl, 0.0);
  EXPECT_NEAR(g[0][0], -0.5 / 2.0, 1e-15);  // only the policy term: -A rho / N
}
