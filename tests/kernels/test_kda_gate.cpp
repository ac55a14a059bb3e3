// KDA gate (kernels/kda_gate.h) against ops/kda_decay.json. The fixture's A_log differs per
// head, so applying it to the wrong head (or per channel) is caught; a test shows the fixture
// is sensitive to exactly that. The fixture's z is f_b(f_a(in)) with the f_a/f_b of
// ops/kda_layer8.json (same tiny model), checked here too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/fixture.h"
#include "kernels/gemm.h"
#include "kernels/kda_gate.h"

using namespace k3;

namespace {
std::vector<float> run_gate(const test::FixTensor& z, const std::vector<float>& A_log, const test::FixTensor& dt,
                            int64_t H, int64_t D, double lb) {
  const int64_t T = z.shape[1];
  std::vector<float> g(T * H * D);
  kda_gate_forward<float>(g.data(), z.data.data(), A_log.data(), dt.data.data(), T, H, D, true, lb);
  return g;
}
}  // namespace

TEST(KDAGate, BoundedMatchesFixture) {
  test::Fixture fx("ops/kda_decay.json");
  auto z = fx.tensor("z"), A = fx.tensor("A_log"), dt = fx.tensor("dt_bias"), g = fx.tensor("g"),
       alpha = fx.tensor("alpha");
  const int64_t H = g.shape[2], D = g.shape[3];
  ASSERT_EQ(A.numel(), H);
  ASSERT_EQ(dt.numel(), H * D);
  const double lb = fx.num("lower_bound");
  auto out = run_gate(z, A.data, dt, H, D, lb);
  test::expect_close(out, g, 1e-5, 1e-4, "kda g");
  std::vector<float> a(out.size());
  for (size_t i = 0; i < out.size(); ++i) a[i] = std::exp(out[i]);
  test::expect_close(a, alpha, 1e-5, 1e-4, "kda alpha");
  for (float v : out) {
    EXPECT_GE(v, float(lb));  // saturates to the floor in float
    EXPECT_LE(v, 0.0f);
  }
  EXPECT_GE(*std::min_element(a.begin(), a.end()), fx.num("alpha_min") - 1e-7);  // e^lower_bound
}

TEST(KDAGate, FixtureCatchesWrongHeadAndPerChannelALog) {
  test::Fixture fx("ops/kda_decay.json");
  auto z = fx.tensor("z"), A = fx.tensor("A_log"), dt = fx.tensor("dt_bias"), g = fx.tensor("g");
  const int64_t H = g.shape[2], D = g.shape[3];
  auto max_err = [&](const std::vector<float>& out) {
    double m = 0;
    for (size_t i = 0; i < out.size(); ++i) m = std::max(m, double(std::fabs(out[i] - g.data[i])));
    return m;
  };
  std::vector<float> rev(A.data.rbegin(), A.data.rend());  // heads reversed
  EXPECT_GT(max_err(run_gate(z, rev, dt, H, D, fx.num("lower_bound"))), 1e-2);
  std::vector<float> shifted(H);  // head h reading head (h+1) % H
  for (int64_t h = 0; h < H; ++h) shifted[h] = A.data[(h + 1) % H];
  EXPECT_GT(max_err(run_gate(z, shifted, dt, H, D, fx.num("lower_bound"))), 1e-2);
  // "Per channel" misuse: channel c of every head scaled by exp(A_log[c % H]) instead of
  // exp(A_log[h]), computed directly.
  std::vector<float> per_ch(g.data.size());
  const int64_t T = z.shape[1];
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H * D; ++c)
      per_ch[t * H * D + c] = float(fx.num("lower_bound")) /
                              (1 + std::exp(-std::exp(A.data[c % H]) * (z.data[t * H * D + c] + dt.data[c])));
  EXPECT_GT(max_err(per_ch), 1e-2);
}

TEST(KDAGate, FixtureZIsLowRankProjectionOfInput) {
  test::Fixture fx("ops/kda_decay.json"), layer("ops/kda_layer8.json");
  auto x = fx.tensor("in"), z = fx.tensor("z"), fa = layer.tensor("f_a"), fb = layer.tensor("f_b");
  const int64_t T = x.shape[1], d = x.shape[2], r = fa.shape[0], HD = fb.shape[0];
  std::vector<float> a(T * r), zz(T * HD);
  linear(a.data(), x.data.data(), fa.data.data(), T, d, r);
  linear(zz.data(), a.data(), fb.data.data(), T, r, HD);
  test::expect_close(zz, z, 1e-5, 1e-4, "z = f_b(f_a(in))");
}

TEST(KDAGate, UnboundedKimiLinearForm) {
  // g = -exp(A_log[h]) * softplus(z + dt_bias); checked at points with closed forms.
  const int64_t H = 2, D = 3;
  std::vector<double> A_log = {0.0, std::log(2.0)}, dt = {0, 0, 0, 0, 0, 0};
  std::vector<double> z = {0.0, std::log(std::exp(1.0) - 1), -50.0, 0.0, 30.0, std::log(std::exp(2.0) - 1)};
  std::vector<double> g(H * D);
  kda_gate_forward<double>(g.data(), z.data(), A_log.data(), dt.data(), 1, H, D, false, -5.0);
  EXPECT_NEAR(g[0], -std::log(2.0), 1e-15);
  EXPECT_NEAR(g[1], -1.0, 1e-15);
  EXPECT_NEAR(g[2], -std::exp(-50.0), 1e-30);
  EXPECT_NEAR(g[3], -2 * std::log(2.0), 1e-15);
  EXPECT_NEAR(g[4], -60.0, 1e-12);
  EXPECT_NEAR(g[5], -4.0, 1e-14);
  // dt_bias is per channel: it shifts only its own channel.
  dt[4] = -30.0;
  kda_gate_forward<double>(g.data(), z.data(), A_log.data(), dt.data(), 1, H, D, false, -5.0);
  EXPECT_NEAR(g[4], -2 * std::log(2.0), 1e-15);
  EXPECT_NEAR(g[5], -4.0, 1e-14);
}
