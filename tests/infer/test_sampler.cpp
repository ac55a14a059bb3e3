#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "infer/sampler.h"

using namespace k3;

TEST(Sampler, GreedyPicksArgmaxLowestIndexOnTies) {
  Sampler s({});
  float l[5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.0f};
  EXPECT_EQ(s.sample(l, 5), 1);
}

TEST(Sampler, TopKOneIsGreedyAndSeedReproduces) {
  float l[4] = {0.0f, 1.0f, 3.0f, 0.5f};
  Sampler a({1.0, 1, 1.0, 7});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.sample(l, 4), 2);
  Sampler b({1.0, 0, 1.0, 42}), c({1.0, 0, 1.0, 42});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(b.sample(l, 4), c.sample(l, 4));
}

TEST(Sampler, TemperatureOneFollowsSoftmax) {
  float l[3] = {0.0f, std::log(2.0f), std::log(5.0f)};  // probs 1/8, 2/8, 5/8
  Sampler s({1.0, 0, 1.0, 3});
  std::map<int, int> n;
  const int N = 40000;
  for (int i = 0; i < N; ++i) n[s.sample(l, 3)]++;
  EXPECT_NEAR(n[0] / double(N), 0.125, 0.01);
  EXPECT_NEAR(n[1] / double(N), 0.25, 0.01);
  EXPECT_NEAR(n[2] / double(N), 0.625, 0.01);
}

TEST(Sampler, TopPCutsTheTail) {
  float l[3] = {0.0f, std::log(2.0f), std::log(5.0f)};
  Sampler s({1.0, 0, 0.6, 5});  // 5/8 = 0.625 >= 0.6: only token 2 survives
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(l, 3), 2);
}

TEST(Sampler, RejectsImpossibleOptions) {
  EXPECT_THROW(Sampler({-1.0, 0, 1.0, 0}), Error);
  EXPECT_THROW(Sampler({1.0, 0, 0.0, 0}), Error);
  EXPECT_THROW(Sampler({1.0, -2, 1.0, 0}), Error);
}
