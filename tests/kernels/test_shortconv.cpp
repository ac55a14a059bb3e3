// Causal depthwise short conv + SiLU (kernels/shortconv.h) against ops/shortconv.json: the
// prefill output, the carried state, and one more decode step from that state; then split
// calls (including pieces shorter than K-1) against one call, in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/fixture.h"
#include "kernels/activations.h"
#include "kernels/shortconv.h"

using namespace k3;

TEST(ShortConv, MatchesFixturePrefillStateAndDecode) {
  test::Fixture fx("ops/shortconv.json");
  auto w = fx.tensor("weight"), x = fx.tensor("in"), y = fx.tensor("out"), st = fx.tensor("state_after");
  auto xn = fx.tensor("in_next"), yn = fx.tensor("out_next");
  const int64_t C = w.shape[0], K = w.shape[2], T = x.shape[1];
  ASSERT_EQ(C, int64_t(fx.num("channels")));
  ASSERT_EQ(K, int64_t(fx.num("kernel")));
  ASSERT_EQ(st.shape, (std::vector<int64_t>{1, C, K - 1}));
  std::vector<float> state(C * (K - 1), 0.0f), out(T * C), pre(T * C);
  shortconv_silu_forward<float>(out.data(), pre.data(), state.data(), x.data.data(), w.data.data(), T, C, K);
  test::expect_close(out, y, 1e-5, 1e-4, "shortconv out");
  test::expect_close(state, st, 0, 0, "shortconv state_after");  // a copy of inputs: exact
  for (int64_t i = 0; i < T * C; ++i) EXPECT_FLOAT_EQ(out[i], silu(pre[i])) << i;
  std::vector<float> out1(C);
  shortconv_silu_forward<float>(out1.data(), nullptr, state.data(), xn.data.data(), w.data.data(), 1, C, K);
  test::expect_close(out1, yn, 1e-5, 1e-4, "shortconv out_next");
}

TEST(ShortConv, SplitCallsEqualOneCall) {
  const int64_t C = 5, K = 4, T = 11;
  std::mt19937 rng(3);
  std::normal_distribution<double> n(0, 1);
  std::vector<double> x(T * C), w(C * K), s0(C * (K - 1));
  for (auto& e : x) e = n(rng);
  for (auto& e : w) e = n(rng);
  for (auto& e : s0) e = n(rng);  // a non-zero carried state
  std::vector<double> st_all = s0, y_all(T * C);
  shortconv_silu_forward<double>(y_all.data(), nullptr, st_all.data(), x.data(), w.data(), T, C, K);
  // Direct formula check with the state as the inputs before x.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        s += w[c * K + j] * (src >= 0 ? x[src * C + c] : s0[c * (K - 1) + (K - 1 + src)]);
      }
      EXPECT_NEAR(y_all[t * C + c], silu(s), 1e-14);
    }
  for (int64_t piece : {1, 2, 3, 5}) {
    std::vector<double> st = s0, y(T * C);
    for (int64_t t0 = 0; t0 < T; t0 += piece) {
      const int64_t L = std::min(piece, T - t0);
      shortconv_silu_forward<double>(y.data() + t0 * C, nullptr, st.data(), x.data() + t0 * C, w.data(), L, C, K);
    }
    for (int64_t i = 0; i < T * C; ++i) EXPECT_EQ(y[i], y_all[i]) << "piece " << piece << " i " << i;
    for (int64_t i = 0; i < C * (K - 1); ++i) EXPECT_EQ(st[i], st_all[i]) << "piece " << piece << " i " << i;
  }
}
