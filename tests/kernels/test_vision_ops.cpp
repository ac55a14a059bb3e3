// The vision encoder's ops (kernels/vision_ops.h, kernels/segment_attention.h): each backward
// against central finite differences in double; the bilinear resampling against values worked
// by hand from F.interpolate's align_corners=False rule; the rotary pairs' layout (column,
// row interleaved); the gemm attention path against the plain reference, forward and backward;
// the block-diagonal mask (a token's output does not change when another segment changes).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "kernels/segment_attention.h"
#include "common/grad_check.h"
#include "kernels/vision_ops.h"

using namespace k3;
using test::check_fd;

TEST(VisionOps, PosInterpMatchesHandWorkedBilinear) {
  // 2 x 2 table, one channel, upsampled to 4 x 4: source coordinate (i + .5) / 2 - .5, clamped
  // at 0: -.25 -> 0, .25, .75, 1.25 -> taps (0,1) l .25 ... last clamps i1 to 1.
  const std::vector<double> t = {0, 1, 2, 3};  // [y][x]
  std::vector<double> o(16);
  pos_interp_forward(o.data(), t.data(), 2, 2, 4, 4, 1);
  const double cx[4] = {0, 0.25, 0.75, 1};  // effective column coordinate
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) EXPECT_NEAR(o[size_t(y * 4 + x)], 2 * cx[y] + cx[x], 1e-12) << y << "," << x;
  // Same size: the table itself (the reference skips interpolation then).
  std::vector<double> same(4);
  pos_interp_forward(same.data(), t.data(), 2, 2, 2, 2, 1);
  EXPECT_EQ(same, t);
}

TEST(VisionOps, PosInterpBackwardFD) {
  for (auto [ph, pw, h, w] : {std::array<int64_t, 4>{3, 4, 5, 2}, {4, 4, 2, 6}, {2, 3, 2, 3}}) {
    const int64_t D = 3;
    std::vector<double> tab = test::randn(ph * pw * D, 1), r = test::randn(h * w * D, 2), g(tab.size(), 0.0);
    pos_interp_backward(g.data(), r.data(), ph, pw, h, w, D);
    auto loss = [&] {
      std::vector<double> o(size_t(h * w * D));
      pos_interp_forward(o.data(), tab.data(), ph, pw, h, w, D);
      return test::dot(o, r);
    };
    check_fd(tab, g, loss, "pos table", 1e-7, 200);
  }
}

TEST(VisionOps, Rope2dPairsInterleaveColumnAndRow) {
  const int64_t hd = 8;
  std::vector<double> ang(hd / 2);
  rope2d_angles(ang.data(), /*y=*/3, /*x=*/5, hd, 10000.0);
  for (int64_t i = 0; i < hd / 4; ++i) {
    const double f = std::pow(10000.0, -4.0 * double(i) / double(hd));
    EXPECT_DOUBLE_EQ(ang[size_t(2 * i)], 5 * f);      // column
    EXPECT_DOUBLE_EQ(ang[size_t(2 * i + 1)], 3 * f);  // row
  }
  // (a, b) rotated as the complex product (a + ib) e^{i ang}.
  std::vector<double> cs(hd / 2), sn(hd / 2), v = {1, 2, 3, 4, 5, 6, 7, 8}, v0 = v;
  for (size_t j = 0; j < cs.size(); ++j) cs[j] = std::cos(ang[j]), sn[j] = std::sin(ang[j]);
  rope2d_apply(v.data(), hd, cs.data(), sn.data(), 1, 1, hd, +1);
  for (int64_t j = 0; j < hd / 2; ++j) {
    EXPECT_NEAR(v[size_t(2 * j)], v0[size_t(2 * j)] * cs[size_t(j)] - v0[size_t(2 * j + 1)] * sn[size_t(j)], 1e-12);
    EXPECT_NEAR(v[size_t(2 * j + 1)], v0[size_t(2 * j)] * sn[size_t(j)] + v0[size_t(2 * j + 1)] * cs[size_t(j)], 1e-12);
  }
}

TEST(VisionOps, Rope2dBackwardFD) {
  const int64_t L = 5, H = 2, hd = 8, ld = 20;
  std::vector<double> x = test::randn(L * ld, 3), r = test::randn(L * ld, 4), cs(L * hd / 2), sn(L * hd / 2), ang(hd / 2);
  for (int64_t t = 0; t < L; ++t) {
    rope2d_angles(ang.data(), t / 2, t % 3, hd, 10000.0);
    for (int64_t j = 0; j < hd / 2; ++j) cs[size_t(t * hd / 2 + j)] = std::cos(ang[size_t(j)]), sn[size_t(t * hd / 2 + j)] = std::sin(ang[size_t(j)]);
  }
  for (int64_t t = 0; t < L; ++t)
    for (int64_t c = H * hd; c < ld; ++c) r[size_t(t * ld + c)] = 0;  // untouched columns carry no loss
  std::vector<double> g = r;
  rope2d_apply(g.data(), ld, cs.data(), sn.data(), L, H, hd, -1);
  auto loss = [&] {
    std::vector<double> y = x;
    rope2d_apply(y.data(), ld, cs.data(), sn.data(), L, H, hd, +1);
    return test::dot(y, r);
  };
  check_fd(x, g, loss, "rope2d input", 1e-7, 200);
}

TEST(VisionOps, GeluGradientsFD) {
  for (double x : {-4.0, -1.3, -0.2, 0.0, 0.4, 1.7, 5.0}) {
    const double h = 1e-6;
    EXPECT_NEAR(gelu_tanh_grad(x), (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2 * h), 1e-8) << x;
    EXPECT_NEAR(gelu_erf_grad(x), (gelu_erf(x + h) - gelu_erf(x - h)) / (2 * h), 1e-8) << x;
  }
  // The two forms differ (the blocks use tanh, the projector erf): not the same function.
  EXPECT_GT(std::fabs(gelu_tanh(1.5) - gelu_erf(1.5)), 1e-5);
  EXPECT_NEAR(gelu_erf(1.0), 0.8413447460685429, 1e-12);
}

TEST(VisionOps, MergeGroupsBlocksRowMajorAndInverts) {
  // Grid 4 x 6 of one-channel patches numbered by position; 2 x 2 merge.
  const int64_t h = 4, w = 6, D = 1;
  std::vector<double> x(h * w);
  for (int64_t i = 0; i < h * w; ++i) x[size_t(i)] = double(i);
  std::vector<double> m(x.size()), back(x.size());
  patch_merge_forward(m.data(), x.data(), h, w, 2, 2, D);
  // Merged token (a, b) = patches (2a, 2b), (2a, 2b+1), (2a+1, 2b), (2a+1, 2b+1).
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b) {
      const double* t = m.data() + (a * 3 + b) * 4;
      EXPECT_EQ(t[0], double(2 * a * w + 2 * b));
      EXPECT_EQ(t[1], double(2 * a * w + 2 * b + 1));
      EXPECT_EQ(t[2], double((2 * a + 1) * w + 2 * b));
      EXPECT_EQ(t[3], double((2 * a + 1) * w + 2 * b + 1));
    }
  patch_merge_backward(back.data(), m.data(), h, w, 2, 2, D);
  EXPECT_EQ(back, x);
}

namespace {

struct SegCase {
  std::vector<int64_t> cu;
  SegmentAttnDims d;
  std::vector<double> qkv, r;
  int64_t L;
  SegCase(std::vector<int64_t> c, int64_t H, int64_t hd, unsigned seed) : cu(std::move(c)) {
    L = cu.back();
    d = {H, hd, 3 * H * hd + 2, 1.0 / std::sqrt(double(hd))};  // +2: padding columns between rows
    qkv = test::randn(L * d.ld_in, seed);
    r = test::randn(L * H * hd, seed + 1);
  }
  double loss() const {
    std::vector<double> o(size_t(L * d.H * d.hd));
    const int64_t Q = d.H * d.hd;
    segment_attention_forward_ref(o.data(), qkv.data(), qkv.data() + Q, qkv.data() + 2 * Q, cu, d);
    return test::dot(o, r);
  }
};

}  // namespace

TEST(VisionOps, SegmentAttentionBackwardRefFD) {
  SegCase c({0, 3, 7, 8}, 2, 4, 11);
  const int64_t Q = c.d.H * c.d.hd;
  std::vector<double> g(c.qkv.size(), 0.0);
  segment_attention_backward_ref(g.data(), g.data() + Q, g.data() + 2 * Q, c.r.data(), c.qkv.data(), c.qkv.data() + Q,
                                 c.qkv.data() + 2 * Q, c.cu, c.d);
  check_fd(c.qkv, g, [&] { return c.loss(); }, "q, k, v", 1e-6, 300);
}

TEST(VisionOps, SegmentAttentionGemmPathEqualsReference) {
  SegCase c({0, 5, 5, 9, 16}, 3, 8, 21);  // includes an empty segment
  const int64_t Q = c.d.H * c.d.hd;
  for (bool dbl : {true, false}) {
    std::vector<double> o_ref(size_t(c.L * Q)), g_ref(c.qkv.size(), 0.0);
    segment_attention_forward_ref(o_ref.data(), c.qkv.data(), c.qkv.data() + Q, c.qkv.data() + 2 * Q, c.cu, c.d);
    segment_attention_backward_ref(g_ref.data(), g_ref.data() + Q, g_ref.data() + 2 * Q, c.r.data(), c.qkv.data(),
                                   c.qkv.data() + Q, c.qkv.data() + 2 * Q, c.cu, c.d);
    double eo, eg;
    if (dbl) {
      std::vector<double> o(o_ref.size()), g(c.qkv.size(), 0.0);
      segment_attention_forward(o.data(), c.qkv.data(), c.qkv.data() + Q, c.qkv.data() + 2 * Q, c.cu, c.d);
      segment_attention_backward(g.data(), g.data() + Q, g.data() + 2 * Q, c.r.data(), c.qkv.data(), c.qkv.data() + Q,
                                 c.qkv.data() + 2 * Q, c.cu, c.d);
      eo = test::rel_rms_mixed(o.data(), o_ref.data(), int64_t(o.size()));
      eg = test::rel_rms_mixed(g.data(), g_ref.data(), int64_t(g.size()));
      EXPECT_LT(eo, 1e-12);
      EXPECT_LT(eg, 1e-12);
    } else {
      const std::vector<float> qkv = test::cast<float>(c.qkv), r = test::cast<float>(c.r);
      std::vector<float> o(o_ref.size()), g(c.qkv.size(), 0.0f);
      segment_attention_forward(o.data(), qkv.data(), qkv.data() + Q, qkv.data() + 2 * Q, c.cu, c.d);
      segment_attention_backward(g.data(), g.data() + Q, g.data() + 2 * Q, r.data(), qkv.data(), qkv.data() + Q,
                                 qkv.data() + 2 * Q, c.cu, c.d);
      eo = test::rel_rms_mixed(o.data(), o_ref.data(), int64_t(o.size()));
      eg = test::rel_rms_mixed(g.data(), g_ref.data(), int64_t(g.size()));
      EXPECT_LT(eo, 1e-5);
      EXPECT_LT(eg, 1e-5);
    }
  }
}

TEST(VisionOps, SegmentAttentionIsBlockDiagonal) {
  SegCase c({0, 4, 10}, 2, 4, 31);
  const int64_t Q = c.d.H * c.d.hd;
  std::vector<double> o1(size_t(c.L * Q)), o2(o1.size());
  segment_attention_forward(o1.data(), c.qkv.data(), c.qkv.data() + Q, c.qkv.data() + 2 * Q, c.cu, c.d);
  std::vector<double> changed = c.qkv;
  for (int64_t t = 4; t < 10; ++t)
    for (int64_t k = 0; k < 3 * Q; ++k) changed[size_t(t * c.d.ld_in + k)] += 1.0;  // segment 1 only
  segment_attention_forward(o2.data(), changed.data(), changed.data() + Q, changed.data() + 2 * Q, c.cu, c.d);
  for (int64_t i = 0; i < 4 * Q; ++i) EXPECT_EQ(o1[size_t(i)], o2[size_t(i)]) << i;
  double moved = 0;
  for (int64_t i = 4 * Q; i < 10 * Q; ++i) moved = std::max(moved, std::fabs(o1[size_t(i)] - o2[size_t(i)]));
  EXPECT_GT(moved, 1e-3);
}
