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
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/activations.h"
#include "kernels/mxfp4_linear.h"
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

// The vectorised SiTU backward against situ_grad's formulas in double, on the same float
// inputs. Tolerance per element: 1e-6 of the sum of the magnitudes of the formula's terms
// (dg is a difference of two terms for g < 0, so its own size can be far below their error).
TEST(SituSimd, BackwardMatchesScalarGradInDouble) {
  const double b1 = 4.0, b2 = 25.0;
  std::vector<float> g = normal(4000, 11, 3.f), u = normal(4000, 12, 30.f), dout = normal(4000, 13);
  const float special[] = {0.f, -0.f, 1e-30f, 2.49f, 2.5f, 2.51f, -2.5f, 15.6f, -15.6f, 60.f, -60.f, 87.f, -87.f,
                           89.f, -89.f, 300.f, -300.f, 1e-3f, -1e-3f};
  for (float a : special)
    for (float b : special) g.push_back(a), u.push_back(b * 10.f), dout.push_back(0.7f);
  const int64_t n = int64_t(g.size());
  std::vector<float> dg(n), du(n);
  situ_backward_fast(dg.data(), du.data(), dout.data(), g.data(), u.data(), n, b1, b2);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    // The reference in double without cancellation: 1 - tanh^2 = 1 / cosh^2, 1 - sigmoid(g) =
    // sigmoid(-g) (situ_grad's 1 - th * th loses all digits in double too once |g| / b1 > 18).
    const double x = double(g[i]) / b1, y = double(u[i]) / b2, a = double(dout[i]);
    const double th = std::tanh(x), sg = 1 / (1 + std::exp(-double(g[i]))), sgm = 1 / (1 + std::exp(double(g[i])));
    const double tu = std::tanh(y), ch = std::cosh(x), cu = std::cosh(y);
    const double t1 = sg / (ch * ch), t2 = b1 * th * sg * sgm;
    const double rg = a * (t1 + t2) * b2 * tu, ru = a * b1 * th * sg / (cu * cu);
    const double scale_g = std::abs(a) * (std::abs(t1) + std::abs(t2)) * std::abs(b2 * tu);
    const double scale_u = std::abs(ru);
    ASSERT_TRUE(std::isfinite(dg[i]) && std::isfinite(du[i])) << "g " << g[i] << " u " << u[i];
    EXPECT_LE(std::abs(dg[i] - rg), 1e-6 * scale_g + 1e-30) << "dg: g " << g[i] << " u " << u[i] << " ref " << rg;
    EXPECT_LE(std::abs(du[i] - ru), 1e-6 * scale_u + 1e-30) << "du: g " << g[i] << " u " << u[i] << " ref " << ru;
    if (scale_g > 1e-20) worst = std::max(worst, std::abs(dg[i] - rg) / scale_g);
  }
  std::printf("situ_backward_fast: worst error %.2e of the terms' size over %ld values\n", worst, long(n));
  // Every tail length, values past n untouched; the [gate | up] row form against activations.h.
  for (int64_t len = 0; len <= 33; ++len) {
    std::vector<float> o1(40, -9.f), o2(40, -9.f), r1(len), r2(len);
    situ_backward_fast(o1.data(), o2.data(), dout.data(), g.data(), u.data(), len, b1, b2);
    situ_backward_reference<float>(r1.data(), r2.data(), dout.data(), g.data(), u.data(), len, b1, b2);
    if (len > 0) test::expect_close(o1.data(), r1.data(), len, 1e-5, 1e-5, "dg tail " + std::to_string(len));
    if (len > 0) test::expect_close(o2.data(), r2.data(), len, 1e-5, 1e-5, "du tail " + std::to_string(len));
    for (int64_t i = len; i < 40; ++i) EXPECT_TRUE(o1[i] == -9.f && o2[i] == -9.f);
  }
  const int64_t rows = 7, F = 37;
  const std::vector<float> gu = normal(rows * 2 * F, 14, 4.f), dact = normal(rows * F, 15);
  std::vector<float> dgu(rows * 2 * F), ref(rows * 2 * F), act(rows * F), act_ref(rows * F);
  situ_glu_backward_fast(dgu.data(), dact.data(), gu.data(), rows, F, b1, b2);
  situ_glu_backward<float>(ref.data(), dact.data(), gu.data(), rows, F, b1, b2);
  test::expect_close(dgu.data(), ref.data(), rows * 2 * F, 1e-5, 1e-5, "situ_glu_backward_fast");
  situ_glu_forward_fast(act.data(), gu.data(), rows, F, b1, b2);
  situ_glu_forward<float>(act_ref.data(), gu.data(), rows, F, b1, b2);
  test::expect_close(act.data(), act_ref.data(), rows * F, 1e-6, 1e-5, "situ_glu_forward_fast");
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

// linear_cols_mxfp4 dequantises 6 rows at a time inside the product: bit for bit
// linear_cols on the whole dequantised matrix, for every row remainder and column block.
TEST(LinearCols, Mxfp4RowsEqualTheDequantisedMatrixBitForBit) {
  const int64_t in = 96, out = 19;
  Tensor Wf = Tensor::empty(DType::F32, {out, in});
  const std::vector<float> w = normal(out * in, 6);
  std::copy(w.begin(), w.end(), Wf.data<float>());
  const Mxfp4Matrix W = Mxfp4Matrix::quantize(Wf);
  std::vector<float> deq(size_t(out * in));
  mxfp4_dequantize(deq.data(), W.packed.data<uint8_t>(), W.scales.data<uint8_t>(), out, in);
  for (int64_t n : {1, 7, 16, 37, 65}) {
    const int64_t ldx = n + 1, ldy = n + 2;
    const std::vector<float> xt = normal(in * ldx, uint32_t(200 + n));
    std::vector<float> y(out * ldy, -7.f), ref(out * ldy, -7.f);
    linear_cols_mxfp4(y.data(), xt.data(), W.packed.data<uint8_t>(), W.scales.data<uint8_t>(), n, in, out, ldx, ldy);
    linear_cols(ref.data(), xt.data(), deq.data(), n, in, out, ldx, ldy);
    EXPECT_EQ(y, ref) << "n " << n;
  }
}
