// The vectorised SiTU (kernels/situ_simd.h) against the scalar SiTU in double, over ordinary
// values, the saturated ends, the Cephes polynomial / exp branch boundary, signed zeros,
// +-inf and NaN, and every tail length; linear_cols (kernels/small_matmul.h) against its
// double reference for every column-block width (1..64 columns and a second block), row
// remainders and strides wider than n.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/fixture.h"
#include "kernels/activations.h"
#include "kernels/situ_simd.h"
#include "kernels/small_matmul.h"

using namespace k3;

namespace {

std::vector<float> normal(int64_t n, uint32_t seed, float sc = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, sc);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST(SituSimd, MatchesScalarSituInDouble) {
  const double b1 = 4.0, b2 = 25.0;
  std::vector<float> g = normal(4000, 1, 3.f), u = normal(4000, 2, 30.f);
  // Branch boundaries and ends: |x / b| around 0.625, tiny, huge, signed zeros.
  const float special[] = {0.f,    -0.f,   1e-30f, -1e-30f, 2.49f, 2.5f,  2.51f,  -2.5f, 15.6f, 15.7f,
                           -15.6f, 60.f,   -60.f,  87.f,    -87.f, 89.f,  -89.f,  300.f, -300.f, 1e30f,
                           -1e30f, 1e-3f, -1e-3f, 0.3f,    -0.3f};
  for (float a : special)
    for (float b : special) g.push_back(a), u.push_back(b * 10.f);
  const int64_t n = int64_t(g.size());
  std::vector<float> out(n);
  situ_forward_fast(out.data(), g.data(), u.data(), n, b1, b2);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double ref = situ<double>(g[i], u[i], b1, b2);
    ASSERT_TRUE(std::isfinite(out[i])) << i << " g " << g[i] << " u " << u[i];
    const double err = std::abs(double(out[i]) - ref);
    if (std::abs(ref) > 1e-30) worst = std::max(worst, err / std::abs(ref));
    // Absolute slack 1e-30: for g < -88 float exp(-g) overflows, so sigmoid(g) is 0 in float
    // (scalar and vector alike) where double still has ~1e-37.
    EXPECT_LE(err, 4e-7 * std::abs(ref) + 1e-30) << "g " << g[i] << " u " << u[i] << " ref " << ref;
  }
  std::printf("situ_forward_fast: worst relative error %.2e over %ld values\n", worst, long(n));
}

TEST(SituSimd, InfNanAndTails) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> g = {inf, -inf, 1.f, nan, 2.f}, u = {3.f, 3.f, inf, 1.f, nan};
  std::vector<float> out(5), ref(5);
  situ_forward_fast(out.data(), g.data(), u.data(), 5, 4.0, 25.0);
  situ_forward_reference<float>(ref.data(), g.data(), u.data(), 5, 4.0, 25.0);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], ref[i], 1e-5 * std::abs(ref[i]) + 1e-30) << i;
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_TRUE(std::isnan(out[4]));
  // Every tail length, and values past n untouched.
  const std::vector<float> a = normal(40, 3, 4.f), b = normal(40, 4, 20.f);
  for (int64_t len = 0; len <= 33; ++len) {
    std::vector<float> o(40, -9.f), r(len);
    situ_forward_fast(o.data(), a.data(), b.data(), len, 4.0, 25.0);
    situ_forward_reference<float>(r.data(), a.data(), b.data(), len, 4.0, 25.0);
    if (len > 0) test::expect_close(o.data(), r.data(), len, 1e-6, 1e-5, "tail " + std::to_string(len));
    for (int64_t i = len; i < 40; ++i) EXPECT_EQ(o[i], -9.f);
  }
}

TEST(LinearCols, MatchesReferenceForEveryColumnBlock) {
  const int64_t in = 37, out = 19;  // 19 rows: two 8-row (or three 6-row) tiles + remainder
  const std::vector<float> W = normal(out * in, 5);
  for (int64_t n : {1, 9, 16, 17, 31, 33, 48, 49, 64, 65, 100}) {
    const int64_t ldx = n + 3, ldy = n + 5;
    const std::vector<float> xt = normal(in * ldx, uint32_t(100 + n));
    std::vector<float> y(out * ldy, -7.f), ref(out * ldy, -7.f);
    linear_cols(y.data(), xt.data(), W.data(), n, in, out, ldx, ldy);
    linear_cols_reference<float>(ref.data(), xt.data(), W.data(), n, in, out, ldx, ldy);
    test::expect_close(y.data(), ref.data(), out * ldy, 1e-5, 1e-5, "n " + std::to_string(n));
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = n; c < ldy; ++c) ASSERT_EQ(y[r * ldy + c], -7.f) << "column past n written";
  }
}
