// RMSNorm and SiTU-GLU against fixtures; their backwards against double-precision finite differences.
#include <gtest/gtest.h>

#include <random>

#include "common/fixture.h"
#include "kernels/activations.h"
#include "kernels/norm.h"

using namespace k3;

TEST(RMSNorm, MatchesFixture) {
  test::Fixture fx("ops/rmsnorm.json");
  auto x = fx.tensor("in"), w = fx.tensor("weight"), y = fx.tensor("out");
  std::vector<float> out(x.data.size());
  rmsnorm_forward<float>(out.data(), nullptr, x.data.data(), w.data.data(), x.shape[0], x.shape[1], fx.num("eps"));
  test::expect_close(out, y, 1e-5, 1e-4, "rmsnorm");
}

TEST(SiTUGLU, MatchesFixtureIncludingSaturation) {
  test::Fixture fx("ops/situ_glu.json");
  auto x = fx.tensor("in"), y = fx.tensor("out");
  const int64_t rows = x.shape[0], F = x.shape[1] / 2;
  std::vector<float> out(rows * F);
  situ_glu_forward<float>(out.data(), x.data.data(), rows, F, fx.num("beta"), fx.num("linear_beta"));
  test::expect_close(out, y, 1e-5, 1e-4, "situ_glu");
  for (float v : out) EXPECT_LE(std::fabs(v), 100.0f);
}

// Central differences in double on a scalar loss L = sum(dy * f(x)).
TEST(RMSNorm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, dim = 7;
  std::mt19937 rng(1);
  std::normal_distribution<double> n(0, 1);
  std::vector<double> x(rows * dim), w(dim), dy(rows * dim), y(rows * dim), rstd(rows), dx(rows * dim), dw(dim, 0);
  for (auto& v : x) v = n(rng);
  for (auto& v : w) v = 1 + 0.3 * n(rng);
  for (auto& v : dy) v = n(rng);
  rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5);
  rmsnorm_backward<double>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    std::vector<double> yy(rows * dim);
    rmsnorm_forward<double>(yy.data(), nullptr, xx.data(), ww.data(), rows, dim, 1e-5);
    double L = 0;
    for (int64_t i = 0; i < rows * dim; ++i) L += dy[i] * yy[i];
    return L;
  };
  const double h = 1e-6;
  for (int64_t i = 0; i < rows * dim; ++i) {
    auto xp = x, xm = x;
    xp[i] += h; xm[i] -= h;
    EXPECT_NEAR(dx[i], (loss(xp, w) - loss(xm, w)) / (2 * h), 1e-7) << i;
  }
  for (int64_t i = 0; i < dim; ++i) {
    auto wp = w, wm = w;
    wp[i] += h; wm[i] -= h;
    EXPECT_NEAR(dw[i], (loss(x, wp) - loss(x, wm)) / (2 * h), 1e-7) << i;
  }
}

TEST(SiTUGLU, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 2, F = 5;
  std::mt19937 rng(2);
  std::normal_distribution<double> n(0, 3);
  std::vector<double> gu(rows * 2 * F), dout(rows * F), dgu(rows * 2 * F);
  for (auto& v : gu) v = n(rng);
  gu[0] = 30; gu[F] = -60;  // beyond both caps
  for (auto& v : dout) v = n(rng);
  situ_glu_backward<double>(dgu.data(), dout.data(), gu.data(), rows, F, 4, 25);
  auto loss = [&](const std::vector<double>& in) {
    std::vector<double> o(rows * F);
    situ_glu_forward<double>(o.data(), in.data(), rows, F, 4, 25);
    double L = 0;
    for (int64_t i = 0; i < rows * F; ++i) L += dout[i] * o[i];
    return L;
  };
  for (size_t i = 0; i < gu.size(); ++i) {
    auto p = gu, m = gu;
    const double h = 1e-6;
    p[i] += h; m[i] -= h;
    EXPECT_NEAR(dgu[i], (loss(p) - loss(m)) / (2 * h), 1e-6 * (1 + std::fabs(dgu[i]))) << i;
  }
}

TEST(L2Norm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 2, dim = 6;
  std::mt19937 rng(3);
  std::normal_distribution<double> n(0, 1);
  std::vector<double> x(rows * dim), dy(rows * dim), y(rows * dim), inv(rows), dx(rows * dim);
  for (auto& v : x) v = n(rng);
  for (auto& v : dy) v = n(rng);
  l2norm_forward<double>(y.data(), inv.data(), x.data(), rows, dim, 1e-6);
  l2norm_backward<double>(dx.data(), dy.data(), x.data(), inv.data(), rows, dim);
  for (int64_t i = 0; i < rows * dim; ++i) {
    auto p = x, m = x;
    const double h = 1e-6;
    p[i] += h; m[i] -= h;
    std::vector<double> yp(rows * dim), ym(rows * dim);
    l2norm_forward<double>(yp.data(), nullptr, p.data(), rows, dim, 1e-6);
    l2norm_forward<double>(ym.data(), nullptr, m.data(), rows, dim, 1e-6);
    double fd = 0;
    for (int64_t j = 0; j < rows * dim; ++j) fd += dy[j] * (yp[j] - ym[j]) / (2 * h);
    EXPECT_NEAR(dx[i], fd, 1e-7) << i;
  }
}
