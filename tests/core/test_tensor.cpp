#include <gtest/gtest.h>

#include <cstdint>

#include "core/tensor.h"
#include "core/threads.h"

using namespace k3;

TEST(Tensor, AlignedOwnedAndViews) {
  Tensor t = Tensor::zeros(DType::F32, {4, 3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = float(i);
  Tensor rows = t.slice0(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.data<float>()[0], 3.0f);
  Tensor flat = t.reshape({12});
  EXPECT_EQ(flat.data<float>()[11], 11.0f);
  Tensor b = t.to(DType::BF16);
  Tensor back = b.to_f32();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(back.data<float>()[i], float(i));
}

TEST(Tensor, ViewKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(8, 2.0f);
  Tensor v = Tensor::view_of(DType::F32, {2, 4}, owner->data(), owner);
  owner.reset();
  EXPECT_EQ(v.data<float>()[7], 2.0f);
}

// Expert-parallel training's buffers (train/trainer_setup.cpp): pages of a mapped buffer take
// memory only once written, and release_pages gives them back (reading zeros again).
TEST(Tensor, MappedZerosTakeMemoryOnlyWhereWrittenAndGiveItBack) {
  const int64_t n = 64 * 1024;  // 256 KiB: 64 pages of 4 KiB
  Tensor t = Tensor::zeros_mapped(DType::F32, {n});
  float* p = t.data<float>();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(resident_bytes(p, sizeof(float) * size_t(n)), 0);
  for (int64_t i = 0; i < 4096; ++i) p[i] = 1.0f;  // 16 KiB written
  const int64_t held = resident_bytes(p, sizeof(float) * size_t(n));
  EXPECT_GE(held, 16 * 1024);
  EXPECT_LT(held, 64 * 1024);
  EXPECT_EQ(resident_bytes(p + 1, 16 * 1024 - 8), 8 * 1024);  // only the whole pages inside
  EXPECT_EQ(release_pages(p, 16 * 1024), 16 * 1024);
  EXPECT_EQ(resident_bytes(p, 16 * 1024), 0);
  EXPECT_EQ(p[0], 0.0f);
  EXPECT_EQ(p[4095], 0.0f);
}

TEST(Threads, ExplicitCountWins) {
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
}
