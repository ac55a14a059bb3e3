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

TEST(Threads, ExplicitCountWins) {
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
}
