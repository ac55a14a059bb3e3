// Vision training data (train/vision_data.h): unifont glyphs render "37+58" as 5 glyphs of
// 8 x 16 with ink; scenes are deterministic, answer what they draw (the drawn colour is the
// answer's, a count question draws that many separate shapes, left/right matches the ink);
// Fashion-MNIST examples name their label; train and test streams differ.
// The image-text stream with task weights: each task's examples in order, none repeated.
#include <gtest/gtest.h>

#include <set>

#include "train/trainer_vision.h"
#include "train/vision_data.h"

using namespace k3;

TEST(VisionData, UnifontRendersDigits) {
  const Unifont f = Unifont::load("/usr/share/unifont/unifont.hex");
  const Image a = f.render("37+58"), b = f.render("37+59");
  EXPECT_EQ(a.height, 16);
  EXPECT_EQ(a.width, 40);
  int ink = 0;
  for (float v : a.rgb) ink += v < 0.5f;
  EXPECT_GT(ink, 3 * 40);
  EXPECT_NE(a.rgb, b.rgb);
}

TEST(VisionData, ScenesAnswerWhatTheyDraw) {
  std::set<std::string> answers;
  for (int64_t i = 0; i < 200; ++i) {
    const VisionExample e = render_scene(7, i), again = render_scene(7, i);
    ASSERT_EQ(e.image.rgb, again.image.rgb);
    ASSERT_EQ(e.answer, again.answer);
    answers.insert(e.answer);
    const int64_t hw = 32 * 32;
    double mr = 0, mg = 0, mb = 0, left = 0, right = 0, n = 0;
    for (int64_t p = 0; p < hw; ++p) {
      const float r = e.image.rgb[size_t(p)], g = e.image.rgb[size_t(hw + p)], b = e.image.rgb[size_t(2 * hw + p)];
      if (r > 0.99f && g > 0.99f && b > 0.99f) continue;
      mr += r, mg += g, mb += b, n += 1;
      ((p % 32) < 16 ? left : right) += 1;
    }
    ASSERT_GT(n, 10) << i;
    if (e.qtype == 0) {
      const std::string c = mr > 0.8 * n && mg > 0.6 * n ? "yellow" : mr > 0.8 * n ? "red" : mg > 0.6 * n ? "green" : "blue";
      EXPECT_EQ(e.answer, c) << i;
    }
    if (e.qtype == 2) {
      EXPECT_EQ(e.answer, left > right ? "left" : "right") << i;
    }
    if (e.qtype == 3) {
      EXPECT_TRUE(e.answer >= "1" && e.answer <= "4") << i;
    }
  }
  for (const char* a : {"red", "green", "blue", "yellow", "square", "circle", "triangle", "left", "right", "1", "4"})
    EXPECT_TRUE(answers.count(a)) << a;
}

TEST(VisionData, FashionAndArithmeticExamples) {
  VisionDataSource src("/usr/share/datasets/fashion-mnist", "/usr/share/unifont/unifont.hex", 1);
  EXPECT_EQ(src.size(VisionTask::Fashion, true), 10000);
  const VisionExample f = src.example(VisionTask::Fashion, true, 0);
  EXPECT_EQ(f.answer, fashion_class_names()[size_t(f.label)]);
  EXPECT_EQ(f.image.height, 28);
  const VisionExample a = src.example(VisionTask::Arithmetic, false, 3), t = src.example(VisionTask::Arithmetic, true, 3);
  EXPECT_EQ(a.image.height, 16);
  EXPECT_EQ(a.image.width, 40);
  EXPECT_NE(a.image.rgb, t.image.rgb);  // test and train streams differ
  const int s = std::stoi(a.answer);
  EXPECT_GE(s, 20);
  EXPECT_LE(s, 198);
}

TEST(VisionData, TaskWeightsShareTheStreamWithoutRepeats) {
  // Equal weights: tasks in turn, index = position / tasks (the stream before weights existed).
  for (int64_t n = 0; n < 30; ++n) {
    const auto [slot, index] = vision_example_at(n, {1, 1, 1});
    EXPECT_EQ(slot, size_t(n % 3));
    EXPECT_EQ(index, n / 3);
  }
  // 4:1:1: per cycle of 6, four of task 0 then one of each other; every task's indices run
  // 0, 1, 2, ... exactly once.
  std::vector<std::vector<int64_t>> seen(3);
  for (int64_t n = 0; n < 60; ++n) {
    const auto [slot, index] = vision_example_at(n, {4, 1, 1});
    EXPECT_EQ(slot, n % 6 < 4 ? 0u : n % 6 == 4 ? 1u : 2u) << n;
    seen[slot].push_back(index);
  }
  ASSERT_EQ(seen[0].size(), 40u);
  ASSERT_EQ(seen[1].size(), 10u);
  for (const auto& s : seen)
    for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i], int64_t(i));
}
