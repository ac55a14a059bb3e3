// Causal softmax attention: the blocked gemm path equals the plain reference (float and
// double) for multi-head, shared key parts, grouped kv heads, strided layouts and a prefix;
// the causal mask and the prefix semantics are checked directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/fixture.h"
#include "kernels/attention.h"

using namespace k3;

namespace {

struct Case {
  AttentionDims d;
  std::vector<double> q, k, kr, v;  // sized from the resolved strides
};

Case make_case(AttentionDims d, uint32_t seed) {
  Case c;
  c.d = d;
  const AttentionDims r = d.resolved();
  const int64_t Tk = d.P + d.Tq;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0, 1);
  auto fill = [&](std::vector<double>& x, int64_t n) {
    x.resize(size_t(n));
    for (auto& v : x) v = nd(rng);
  };
  fill(c.q, (d.Tq - 1) * r.q_tok + (d.H - 1) * r.q_head + d.Dk + d.Dr);
  fill(c.k, (Tk - 1) * r.k_tok + (d.Hkv - 1) * r.k_head + d.Dk);
  fill(c.kr, d.Dr ? (Tk - 1) * r.kr_tok + d.Dr : 0);
  fill(c.v, (Tk - 1) * r.v_tok + (d.Hkv - 1) * r.v_head + d.Dv);
  return c;
}

std::vector<float> f32(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

// Runs the double reference, the float reference and the blocked path; compares all three.
void check_case(const AttentionDims& dims, uint32_t seed) {
  Case c = make_case(dims, seed);
  const AttentionDims r = dims.resolved();
  const int64_t on = (dims.Tq - 1) * r.o_tok + (dims.H - 1) * r.o_head + dims.Dv;
  std::vector<double> od(on, 0.0);
  attention_forward_ref<double>(od.data(), c.q.data(), c.k.data(), dims.Dr ? c.kr.data() : nullptr, c.v.data(), dims);
  auto qf = f32(c.q), kf = f32(c.k), krf = f32(c.kr), vf = f32(c.v);
  std::vector<float> of(on, 0.f), ob(on, 0.f);
  attention_forward_ref<float>(of.data(), qf.data(), kf.data(), dims.Dr ? krf.data() : nullptr, vf.data(), dims);
  AttentionScratch scratch;
  attention_forward(ob.data(), qf.data(), kf.data(), dims.Dr ? krf.data() : nullptr, vf.data(), dims, scratch);
  std::vector<float> odf(od.begin(), od.end());
  test::expect_close(of.data(), odf.data(), on, 1e-5, 1e-4, "float reference vs double");
  test::expect_close(ob.data(), odf.data(), on, 1e-5, 1e-4, "blocked vs double reference");
  EXPECT_LT(test::rel_rms(ob.data(), odf.data(), on), 1e-6);
}

}  // namespace

TEST(Attention, BlockedMatchesReferenceMultiHead) {
  AttentionDims d;
  d.Tq = 70;  // two query tiles
  d.H = d.Hkv = 3;
  d.Dk = 16;
  d.Dv = 8;
  d.scale = 0.25;
  check_case(d, 1);
}

TEST(Attention, BlockedMatchesReferenceWithPrefixAndSharedKeyPart) {
  AttentionDims d;
  d.Tq = 5;
  d.P = 11;
  d.H = d.Hkv = 4;
  d.Dk = 12;
  d.Dr = 4;
  d.Dv = 6;
  d.scale = 1 / std::sqrt(16.0);
  check_case(d, 2);
}

TEST(Attention, BlockedMatchesReferenceGroupedKvHeads) {
  AttentionDims d;  // absorbed-MLA shape: one kv head shared by all query heads
  d.Tq = 3;
  d.P = 9;
  d.H = 8;
  d.Hkv = 1;
  d.Dk = 32;
  d.Dr = 8;
  d.Dv = 32;
  d.scale = 0.17;
  check_case(d, 3);
  d.Hkv = 2;  // GQA-style groups
  d.Tq = 40;
  d.P = 0;
  check_case(d, 4);
}

TEST(Attention, BlockedMatchesReferenceStridedLayouts) {
  AttentionDims d;  // MLA prefill: k and v interleaved per head in one [T, H, nope + v] buffer
  d.Tq = 9;
  d.P = 2;
  d.H = d.Hkv = 2;
  d.Dk = 6;
  d.Dr = 2;
  d.Dv = 4;
  d.scale = 0.3;
  d.k_head = d.v_head = 10;
  d.k_tok = d.v_tok = 20;
  d.q_tok = 19;  // padded query rows
  d.o_tok = 11;
  d.o_head = 5;
  check_case(d, 5);
}

TEST(Attention, CausalMaskAndPrefixConsistency) {
  AttentionDims d;
  d.Tq = 12;
  d.H = d.Hkv = 2;
  d.Dk = 8;
  d.Dv = 8;
  d.scale = 0.35;
  Case c = make_case(d, 7);
  std::vector<double> full(d.Tq * d.H * d.Dv);
  attention_forward_ref<double>(full.data(), c.q.data(), c.k.data(), nullptr, c.v.data(), d);
  // The first query sees only key 0: its output is v_0.
  for (int64_t h = 0; h < d.H; ++h)
    for (int64_t j = 0; j < d.Dv; ++j) EXPECT_NEAR(full[h * d.Dv + j], c.v[h * d.Dv + j], 1e-12);
  // Changing the last key and value leaves every earlier output untouched.
  auto k2 = c.k, v2 = c.v;
  for (int64_t i = (d.Tq - 1) * d.H * d.Dk; i < int64_t(k2.size()); ++i) k2[i] += 3;
  for (int64_t i = (d.Tq - 1) * d.H * d.Dv; i < int64_t(v2.size()); ++i) v2[i] -= 2;
  std::vector<double> mod(full.size());
  attention_forward_ref<double>(mod.data(), c.q.data(), k2.data(), nullptr, v2.data(), d);
  for (int64_t i = 0; i < (d.Tq - 1) * d.H * d.Dv; ++i) EXPECT_EQ(mod[i], full[i]);
  EXPECT_GT(std::fabs(mod.back() - full.back()), 1e-6);
  // The last 5 queries with the first 7 tokens as a prefix give the same rows (blocked path).
  AttentionDims p = d;
  p.P = 7;
  p.Tq = 5;
  auto qf = f32(c.q), kf = f32(c.k), vf = f32(c.v);
  std::vector<float> tail(p.Tq * d.H * d.Dv);
  AttentionScratch s;
  attention_forward(tail.data(), qf.data() + 7 * d.H * d.Dk, kf.data(), nullptr, vf.data(), p, s);
  std::vector<float> want(full.begin() + 7 * d.H * d.Dv, full.end());
  test::expect_close(tail.data(), want.data(), int64_t(want.size()), 1e-5, 1e-4, "prefix rows");
}
