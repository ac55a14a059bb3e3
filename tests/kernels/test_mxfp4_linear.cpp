// MXFP4 products (kernels/mxfp4_linear.h): the fused-decode linear against its double
// reference for every row-block shape (1..4 rows of x per block, remainders of weight rows,
// ldy > out, accumulate), the reference against a product with the dequantised matrix, the
// fast dequantisation bit-identical to mxfp4_decode_row (including the E8M0 edge scales 0
// and 255).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/fixture.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/mxfp4_linear.h"

using namespace k3;

namespace {

std::vector<float> normal(int64_t n, uint32_t seed, float sc = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, sc);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

Mxfp4Matrix quantized(int64_t rows, int64_t cols, uint32_t seed) {
  const std::vector<float> w = normal(rows * cols, seed, 0.05f);
  return Mxfp4Matrix::quantize(Tensor::from_f32({rows, cols}, w.data()));
}

}  // namespace

TEST(Mxfp4Linear, MatchesReferenceForEveryBlockShape) {
  // 11 rows = two 4-row blocks + 3; 3 groups (fewer than a vector of scales) and 18 (whole
  // vectors of scales and a remainder on every target).
  for (const int64_t in : {96, 576}) {
  const int64_t out = 11;
  const Mxfp4Matrix W = quantized(out, in, uint32_t(in));
  const uint8_t* p = W.packed.data<uint8_t>();
  const uint8_t* s = W.scales.data<uint8_t>();
  for (int64_t rows : {1, 2, 3, 4, 5, 7, 9}) {
    const std::vector<float> x = normal(rows * in, uint32_t(10 + rows));
    const int64_t ldy = out + 3;
    std::vector<float> y(rows * ldy, -7.f), ref(rows * ldy, -7.f);
    mxfp4_linear(y.data(), x.data(), p, s, rows, in, out, ldy);
    mxfp4_linear_reference<float>(ref.data(), x.data(), p, s, rows, in, out, ldy);
    test::expect_close(y.data(), ref.data(), rows * ldy, 1e-6, 1e-5, "rows " + std::to_string(rows));
    for (int64_t t = 0; t < rows; ++t)  // columns past `out` untouched
      for (int64_t c = out; c < ldy; ++c) EXPECT_EQ(y[t * ldy + c], -7.f);
    mxfp4_linear(y.data(), x.data(), p, s, rows, in, out, ldy, /*accumulate=*/true);
    mxfp4_linear_reference<float>(ref.data(), x.data(), p, s, rows, in, out, ldy, /*accumulate=*/true);
    test::expect_close(y.data(), ref.data(), rows * ldy, 1e-6, 1e-5, "accumulate, rows " + std::to_string(rows));
  }
  }
}

TEST(Mxfp4Linear, ReferenceEqualsDequantisedProduct) {
  const int64_t in = 64, out = 8, rows = 3;
  const Mxfp4Matrix W = quantized(out, in, 2);
  const Tensor Wf = W.dequantize();
  const std::vector<float> x = normal(rows * in, 3);
  std::vector<double> xd(x.begin(), x.end()), y(rows * out);
  mxfp4_linear_reference<double>(y.data(), xd.data(), W.packed.data<uint8_t>(), W.scales.data<uint8_t>(), rows, in, out,
                                 out);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t r = 0; r < out; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < in; ++c) acc += double(Wf.data<float>()[r * in + c]) * xd[t * in + c];
      EXPECT_EQ(y[t * out + r], acc);
    }
}

TEST(Mxfp4Dequantize, BitIdenticalToDecodeRowIncludingEdgeScales) {
  const int64_t rows = 5, cols = 288;  // 9 groups: the fused product converts whole vectors of scales and a remainder
  Mxfp4Matrix W = quantized(rows, cols, 4);
  uint8_t* s = W.scales.data<uint8_t>();
  s[0] = 0;    // 2^-127, subnormal
  s[1] = 255;  // NaN
  s[2] = 254;  // 2^127
  s[4] = 1;
  s[9 + 8] = 0;  // row 1, group 8 (the remainder after a vector of 8 scales)
  s[2 * 9 + 7] = 140;
  s[3 * 9 + 5] = 0;
  std::vector<float> fast(rows * cols), ref(rows * cols);
  mxfp4_dequantize(fast.data(), W.packed.data<uint8_t>(), s, rows, cols);
  mxfp4_dequantize_reference<float>(ref.data(), W.packed.data<uint8_t>(), s, rows, cols);
  EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)), 0);
  int nan = 0;
  for (int64_t c = 32; c < 64; ++c) nan += std::isnan(fast[c]);
  EXPECT_EQ(nan, 32);  // group 1 of row 0 has the NaN scale
  // The same edge scales through the fused product: a NaN group poisons only its own row.
  const std::vector<float> x = normal(cols, 5);
  std::vector<float> y(rows), yr(rows);
  mxfp4_linear(y.data(), x.data(), W.packed.data<uint8_t>(), s, 1, cols, rows, rows);
  mxfp4_linear_reference<float>(yr.data(), x.data(), W.packed.data<uint8_t>(), s, 1, cols, rows, rows);
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(yr[0]));
  test::expect_close(y.data() + 1, yr.data() + 1, rows - 1, 1e-6, 1e-5, "rows without the NaN scale");
}
