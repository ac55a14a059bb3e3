// Attention-Residual read: fixture ops/attnres.json (8 block sums laid out [T, blocks, d]
// plus the partial sum as the last source), double == float, zero query = uniform mix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/fixture.h"
#include "kernels/attn_res.h"

using namespace k3;

TEST(AttnRes, MatchesFixture) {
  test::Fixture fx("ops/attnres.json");
  auto br = fx.tensor("block_residual"), ps = fx.tensor("prefix_sum"), wp = fx.tensor("proj_weight"),
       wn = fx.tensor("norm_weight"), fold = fx.tensor("fold_hint"), want = fx.tensor("out");
  const int64_t T = br.shape[0], B = br.shape[1], d = br.shape[2], S = int64_t(fx.num("n_sources"));
  ASSERT_EQ(S, B + 1);
  // The fixture's block stack is token-major [T, B, d]: give each block its own [T, d] array.
  std::vector<std::vector<float>> blocks(B, std::vector<float>(T * d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < d; ++c) blocks[b][t * d + c] = br.data[(t * B + b) * d + c];
  std::vector<const float*> src;
  for (auto& b : blocks) src.push_back(b.data());
  src.push_back(ps.data.data());
  for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(fold.data[c], wp.data[c] * wn.data[c], 1e-5);
  std::vector<float> out(T * d), alpha(T * S);
  attn_res_forward<float>(out.data(), alpha.data(), src.data(), S, wn.data.data(), wp.data.data(), T, d, fx.num("eps"));
  test::expect_close(out, want, 1e-5, 1e-4, "attnres out");
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += alpha[t * S + s];
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  // Without alpha storage the result is the same.
  std::vector<float> out2(T * d);
  attn_res_forward<float>(out2.data(), nullptr, src.data(), S, wn.data.data(), wp.data.data(), T, d, fx.num("eps"));
  EXPECT_EQ(out, out2);
}

TEST(AttnRes, DoubleMatchesFloatAndZeroQueryIsUniform) {
  const int64_t T = 5, d = 24, S = 4;
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0, 1);
  std::vector<std::vector<double>> srcd(S, std::vector<double>(T * d));
  std::vector<std::vector<float>> srcf(S, std::vector<float>(T * d));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < T * d; ++i) srcf[s][i] = float(srcd[s][i] = nd(rng) * (s + 1));
  std::vector<double> wn(d), wp(d);
  for (auto& v : wn) v = 1 + 0.2 * nd(rng);
  for (auto& v : wp) v = nd(rng);
  std::vector<float> wnf(wn.begin(), wn.end()), wpf(wp.begin(), wp.end());
  std::vector<const double*> pd;
  std::vector<const float*> pf;
  for (int64_t s = 0; s < S; ++s) {
    pd.push_back(srcd[s].data());
    pf.push_back(srcf[s].data());
  }
  std::vector<double> od(T * d), ad(T * S);
  std::vector<float> of(T * d), af(T * S);
  attn_res_forward<double>(od.data(), ad.data(), pd.data(), S, wn.data(), wp.data(), T, d, 1e-5);
  attn_res_forward<float>(of.data(), af.data(), pf.data(), S, wnf.data(), wpf.data(), T, d, 1e-5);
  for (int64_t i = 0; i < T * d; ++i) EXPECT_NEAR(of[i], od[i], 1e-5 * (1 + std::fabs(od[i])));
  // A manual check of one token's weights in double.
  for (int64_t t = 0; t < T; ++t) {
    double sc[S], mx = -1e300, z = 0;
    for (int64_t s = 0; s < S; ++s) {
      double ss = 0, dot = 0;
      for (int64_t c = 0; c < d; ++c) ss += srcd[s][t * d + c] * srcd[s][t * d + c];
      const double r = 1 / std::sqrt(ss / d + 1e-5);
      for (int64_t c = 0; c < d; ++c) dot += wp[c] * wn[c] * srcd[s][t * d + c] * r;
      sc[s] = dot;
      mx = std::max(mx, dot);
    }
    for (int64_t s = 0; s < S; ++s) z += std::exp(sc[s] - mx);
    for (int64_t s = 0; s < S; ++s) EXPECT_NEAR(ad[t * S + s], std::exp(sc[s] - mx) / z, 1e-12);
  }
  // Pseudo-queries start at zero: w_p = 0 mixes the sources uniformly.
  std::vector<double> zero(d, 0.0);
  attn_res_forward<double>(od.data(), ad.data(), pd.data(), S, wn.data(), zero.data(), T, d, 1e-5);
  for (int64_t i = 0; i < T * d; ++i) {
    double mean = 0;
    for (int64_t s = 0; s < S; ++s) mean += srcd[s][i] / S;
    EXPECT_NEAR(od[i], mean, 1e-12);
  }
}
