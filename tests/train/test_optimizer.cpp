// AdamW against a hand-computed step; Muon's Newton-Schulz gives a near-orthogonal update and
// per-head orthogonalisation treats each head's rows separately; clipping; WSD schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/gemm.h"
#include "train/optimizer.h"

using namespace k3;

TEST(AdamW, MatchesHandComputedSteps) {
  std::vector<float> w = {1.0f, -2.0f}, g = {0.5f, -1.0f};
  OptimizerOptions o;
  o.beta1 = 0.9; o.beta2 = 0.99; o.eps = 1e-8; o.weight_decay = 0.1;
  Optimizer opt({{"w", w.data(), g.data(), 1, 2, OptKind::AdamW, 1, true}}, o);
  opt.step(0.01);
  // t=1: m = 0.1 g, v = 0.01 g^2; m_hat = g, v_hat = g^2; update = lr * sign(g).
  EXPECT_NEAR(w[0], 1.0 * (1 - 0.001) - 0.01, 1e-6);
  EXPECT_NEAR(w[1], -2.0 * (1 - 0.001) + 0.01, 1e-6);
  opt.step(0.01);
  // t=2 with the same g: m_hat = g, v_hat = g^2 again.
  EXPECT_NEAR(w[0], (1.0 * 0.999 - 0.01) * 0.999 - 0.01, 1e-6);
}

static double orthogonality_error(const std::vector<float>& X, int64_t r, int64_t c) {
  std::vector<float> G(static_cast<size_t>(r * r));
  gemm(false, true, r, r, c, 1.0f, X.data(), c, X.data(), c, 0.0f, G.data(), r);
  double e = 0;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) e = std::max(e, std::fabs(G[i * r + j] - (i == j ? 1.0 : 0.0)));
  return e;
}

TEST(Muon, NewtonSchulzIsNearlyOrthogonal) {
  for (auto [r, c] : {std::pair<int64_t, int64_t>{16, 48}, {48, 16}}) {
    std::mt19937 rng(1);
    std::normal_distribution<float> n(0, 1);
    std::vector<float> X(static_cast<size_t>(r * c));
    for (auto& x : X) x = n(rng);
    std::vector<float> scratch(static_cast<size_t>(3 * 16 * 16 + 3 * r * c));
    newton_schulz5(X.data(), r, c, 5, scratch.data());
    // The quintic iteration maps singular values into roughly [0.7, 1.2], not exactly 1.
    if (r <= c) {
      EXPECT_LT(orthogonality_error(X, r, c), 0.45);
    }
    double ss = 0;
    for (float x : X) ss += x * x;
    EXPECT_NEAR(std::sqrt(ss / double(std::min(r, c))), 1.0, 0.3);
  }
}

TEST(Muon, PerHeadOrthogonalisesEachHeadSeparately) {
  const int64_t H = 2, D = 4, in = 8;
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> w(static_cast<size_t>(H * D * in), 0.0f), g(w.size());
  for (auto& x : g) x = n(rng);
  for (int64_t i = 0; i < D * in; ++i) g[i] *= 100.0f;  // head 0 has a much larger gradient
  OptimizerOptions o;
  o.weight_decay = 0;
  o.muon_nesterov = false;
  Optimizer opt({{"q_proj", w.data(), g.data(), H * D, in, OptKind::Muon, H, false}}, o);
  opt.step(1.0);
  // Each head's update is orthogonalised on its own, so both heads get updates of equal
  // RMS despite the 100x gradient scale difference.
  double s0 = 0, s1 = 0;
  for (int64_t i = 0; i < D * in; ++i) { s0 += w[i] * w[i]; s1 += w[D * in + i] * w[D * in + i]; }
  EXPECT_NEAR(s0 / s1, 1.0, 0.25);
  // Head 1's update equals NS applied to head 1's gradient alone.
  std::vector<float> h1(g.begin() + D * in, g.end()), scratch(1024);
  newton_schulz5(h1.data(), D, in, 5, scratch.data());
  const float scale = float(0.2 * std::sqrt(8.0));
  for (int64_t i = 0; i < D * in; ++i) EXPECT_NEAR(w[D * in + i], -scale * h1[i], 1e-5);
}

TEST(Clip, ScalesToMaxNorm) {
  std::vector<float> w(2), g = {3.0f, 4.0f};
  std::vector<ParamRef> ps = {{"w", w.data(), g.data(), 1, 2}};
  EXPECT_NEAR(clip_grad_norm(ps, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(global_grad_norm(ps), 1.0, 1e-5);
}

TEST(Schedule, WarmupStableDecay) {
  EXPECT_NEAR(wsd_lr(0, 100, 1.0, 0.1, 10, 20), 0.1, 1e-12);
  EXPECT_NEAR(wsd_lr(9, 100, 1.0, 0.1, 10, 20), 1.0, 1e-12);
  EXPECT_NEAR(wsd_lr(50, 100, 1.0, 0.1, 10, 20), 1.0, 1e-12);
  EXPECT_NEAR(wsd_lr(99, 100, 1.0, 0.1, 10, 20), 0.1, 1e-12);
  EXPECT_GT(wsd_lr(85, 100, 1.0, 0.1, 10, 20), 0.1);
}
