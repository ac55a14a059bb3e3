// Scalar conversions (round to nearest even) and MXFP4 decode against real checkpoint bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/fixture.h"
#include "core/dtype.h"
#include "core/tensor.h"

using namespace k3;

static float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
  // 1.0078125 + half ulp: ties to even (mantissa ...10).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // just above halfway rounds up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(INFINITY)), INFINITY);
  for (float v : {0.0f, -2.5f, 3.140625f, 1e30f, -1e-30f}) EXPECT_EQ(bf16_to_f32(f32_to_bf16(v)), bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(v)))));
}

TEST(DType, F16RoundTripAndRounding) {
  for (float v : {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // overflows to inf
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // halfway: ties to even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);  // halfway: ties to even (up)
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  // Every f16 bit pattern that is finite survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
}

TEST(DType, Mxfp4DecodesRealCheckpointBytes) {
  test::Fixture fx("mxfp4.json");
  auto packed = fx.tensor("packed"), scales = fx.tensor("scales"), expected = fx.tensor("expected");
  const int64_t rows = fx.json()["rows"], cols = fx.json()["logical_width"];
  ASSERT_EQ(packed.shape, (std::vector<int64_t>{rows, cols / 2}));
  Tensor p = Tensor::empty(DType::U8, {rows, cols / 2}), s = Tensor::empty(DType::U8, {rows, cols / 32});
  for (int64_t i = 0; i < p.numel(); ++i) p.data<uint8_t>()[i] = uint8_t(packed.data[i]);
  for (int64_t i = 0; i < s.numel(); ++i) s.data<uint8_t>()[i] = uint8_t(scales.data[i]);
  Mxfp4Matrix m = Mxfp4Matrix::from(p, s, "experts.0.w1");
  Tensor w = m.dequantize();
  ASSERT_EQ(w.numel(), expected.numel());
  for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(w.data<float>()[i], expected.data[i]) << "index " << i;
  // The nibble-order trap: the swapped decoding must NOT match.
  auto swapped = fx.json()["expected_swapped_nibbles"]["first64"].get<std::vector<float>>();
  int differ = 0;
  for (size_t i = 0; i < swapped.size(); ++i) differ += w.data<float>()[i] != swapped[i];
  EXPECT_GT(differ, 0);
}

TEST(DType, Mxfp4EncodeIsInverseOnRepresentableValues) {
  test::Fixture fx("mxfp4.json");
  auto expected = fx.tensor("expected");
  Tensor w = Tensor::from_f32({64, 3584}, expected.data.data());
  Tensor back = Mxfp4Matrix::quantize(w).dequantize();
  for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(back.data<float>()[i], w.data<float>()[i]) << i;
}

TEST(DType, Mxfp4RejectsMismatchedScales) {
  Tensor p = Tensor::zeros(DType::U8, {4, 16}), s = Tensor::zeros(DType::U8, {4, 2});
  EXPECT_THROW(Mxfp4Matrix::from(p, s, "w"), Error);
}
