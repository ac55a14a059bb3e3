// Routed SiTU-GLU experts: dispatch (counting sort), grouped gemm path == plain reference
// for f32 and MXFP4 experts (including experts that get no tokens), and bitwise
// determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/fixture.h"
#include "core/threads.h"
#include "kernels/moe.h"

using namespace k3;

namespace {

struct Experts {
  int64_t E, F, l;
  std::vector<std::vector<float>> w1, w3, w2;
  std::vector<Mxfp4Matrix> m1, m3, m2;
  std::vector<ExpertMatrix> e1, e3, e2;

  Experts(int64_t E_, int64_t F_, int64_t l_, uint32_t seed) : E(E_), F(F_), l(l_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0, 1);
    auto mat = [&](int64_t r, int64_t c, float sc) {
      std::vector<float> m(r * c);
      for (auto& v : m) v = nd(rng) * sc;
      return m;
    };
    for (int64_t e = 0; e < E; ++e) {
      w1.push_back(mat(F, l, 1.5f / std::sqrt(float(l))));
      w3.push_back(mat(F, l, 1.5f / std::sqrt(float(l))));
      w2.push_back(mat(l, F, 1.f / std::sqrt(float(F))));
    }
  }
  void use_f32() {
    e1.clear(), e3.clear(), e2.clear();
    for (int64_t e = 0; e < E; ++e) {
      e1.push_back({w1[e].data(), nullptr, F, l});
      e3.push_back({w3[e].data(), nullptr, F, l});
      e2.push_back({w2[e].data(), nullptr, l, F});
    }
  }
  // Quantises every matrix; the f32 copies become the dequantised values.
  void use_mxfp4() {
    m1.clear(), m3.clear(), m2.clear();
    auto q = [](std::vector<float>& w, int64_t r, int64_t c) {
      Mxfp4Matrix m = Mxfp4Matrix::quantize(Tensor::from_f32({r, c}, w.data()));
      Tensor dq = m.dequantize();
      std::copy(dq.data<float>(), dq.data<float>() + r * c, w.begin());
      return m;
    };
    for (int64_t e = 0; e < E; ++e) {
      m1.push_back(q(w1[e], F, l));
      m3.push_back(q(w3[e], F, l));
      m2.push_back(q(w2[e], l, F));
    }
    e1.clear(), e3.clear(), e2.clear();
    for (int64_t e = 0; e < E; ++e) {
      e1.push_back({nullptr, &m1[e], F, l});
      e3.push_back({nullptr, &m3[e], F, l});
      e2.push_back({nullptr, &m2[e], l, F});
    }
  }
};

// k distinct experts per token drawn from [0, E - skip): the last `skip` experts get nothing.
void random_routing(std::vector<int32_t>& idx, std::vector<float>& w, int64_t T, int64_t E, int64_t k, int64_t skip,
                    uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(0.05f, 1.f);
  idx.resize(T * k);
  w.resize(T * k);
  std::vector<int32_t> perm(E - skip);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E - skip; ++e) perm[e] = int32_t(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < k; ++i) {
      idx[t * k + i] = perm[i];
      w[t * k + i] = ud(rng);
    }
  }
}

std::vector<float> random_rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> z(n);
  for (auto& v : z) v = nd(rng);
  return z;
}

}  // namespace

TEST(MoEDispatch, CountingSortIsStableByToken) {
  const int32_t idx[] = {2, 0, 1, 2, 2, 1};  // T = 3, k = 2, E = 4 (expert 3 empty)
  MoEDispatch dp;
  moe_dispatch(dp, idx, 3, 2, 4);
  EXPECT_EQ(dp.offset, (std::vector<int64_t>{0, 1, 3, 6, 6}));
  EXPECT_EQ(dp.token, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(dp.slot, (std::vector<int64_t>{1, 2, 5, 0, 3, 4}));
}

TEST(MoEExperts, GroupedMatchesReferenceWithEmptyExperts) {
  const int64_t E = 64, k = 8, T = 50, l = 32, F = 24;
  Experts ex(E, F, l, 11);
  ex.use_f32();
  std::vector<int32_t> idx;
  std::vector<float> w;
  random_routing(idx, w, T, E, k, 4, 12);
  auto z = random_rows(T * l, 13);
  std::vector<float> u(T * l), ref(T * l);
  MoEExpertScratch s;
  moe_experts_forward(u.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(), T, l, F, E,
                      k, 4.0, 25.0, s);
  moe_experts_forward_reference(ref.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(),
                                T, l, F, E, k, 4.0, 25.0, s);
  EXPECT_LE(int64_t(s.active.size()), E - 4);  // the skipped experts were never touched
  test::expect_close(u.data(), ref.data(), T * l, 1e-5, 1e-4, "grouped vs reference");
  EXPECT_LT(test::rel_rms(u.data(), ref.data(), T * l), 1e-6);
  // Reusing the warm scratch on a smaller batch still matches the reference rows.
  std::vector<float> u2(10 * l);
  moe_experts_forward(u2.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(), 10, l, F,
                      E, k, 4.0, 25.0, s);
  test::expect_close(u2.data(), ref.data(), 10 * l, 1e-5, 1e-4, "smaller batch, warm scratch");
}

TEST(MoEExperts, Mxfp4GroupedMatchesReference) {
  const int64_t E = 16, k = 4, T = 20, l = 64, F = 32;  // MXFP4 rows need cols % 32 == 0
  Experts ex(E, F, l, 21);
  ex.use_mxfp4();
  std::vector<int32_t> idx;
  std::vector<float> w;
  random_routing(idx, w, T, E, k, 2, 22);
  auto z = random_rows(T * l, 23);
  std::vector<float> u(T * l), ref_mx(T * l), ref_f32(T * l);
  MoEExpertScratch s;
  moe_experts_forward(u.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(), T, l, F, E,
                      k, 4.0, 25.0, s);
  moe_experts_forward_reference(ref_mx.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(),
                                ex.e2.data(), T, l, F, E, k, 4.0, 25.0, s);
  ex.use_f32();  // now the dequantised values as f32 matrices
  moe_experts_forward_reference(ref_f32.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(),
                                ex.e2.data(), T, l, F, E, k, 4.0, 25.0, s);
  EXPECT_EQ(ref_mx, ref_f32);
  test::expect_close(u.data(), ref_f32.data(), T * l, 1e-5, 1e-4, "mxfp4 grouped vs dequantised reference");
}

TEST(MoEExperts, DeterministicAcrossThreadCounts) {
  const int64_t E = 32, k = 4, T = 40, l = 32, F = 32;
  Experts ex(E, F, l, 31);
  ex.use_f32();
  std::vector<int32_t> idx;
  std::vector<float> w;
  random_routing(idx, w, T, E, k, 0, 32);
  auto z = random_rows(T * l, 33);
  std::vector<float> a(T * l), b(T * l), c(T * l);
  MoEExpertScratch s1, s2;
  const int before = num_threads();
  set_num_threads(1);
  moe_experts_forward(a.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(), T, l, F, E,
                      k, 4.0, 25.0, s1);
  set_num_threads(2);
  moe_experts_forward(b.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(), T, l, F, E,
                      k, 4.0, 25.0, s2);
  moe_experts_forward(c.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(), T, l, F, E,
                      k, 4.0, 25.0, s2);
  set_num_threads(before);
  EXPECT_EQ(a, b);
  EXPECT_EQ(b, c);
}

// MXFP4 experts take the fused-decode product up to 8 rows and the dequantise + column
// product beyond: route so that some experts get 1..8 rows and others many (up to all T),
// and check both against the reference, with the training saves in both layouts.
TEST(MoEExperts, Mxfp4BothRowPathsMatchReference) {
  const int64_t E = 12, k = 3, T = 40, l = 64, F = 32;
  Experts ex(E, F, l, 41);
  ex.use_mxfp4();
  std::vector<int32_t> idx(T * k);
  std::vector<float> w(T * k);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> ud(0.05f, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    idx[t * k] = 0;                                    // expert 0: all 40 rows (column path)
    idx[t * k + 1] = t < 20 ? 1 : 2;                   // experts 1, 2: 20 rows each
    idx[t * k + 2] = int32_t(3 + t % 9);               // experts 3..11: 4 or 5 rows (fused)
    for (int64_t i = 0; i < k; ++i) w[t * k + i] = ud(rng);
  }
  auto z = random_rows(T * l, 43);
  std::vector<float> u(T * l), ref(T * l), gu(T * k * 2 * F), y(T * k * l), gur(gu.size()), yr(y.size());
  MoEExpertScratch s;
  moe_experts_forward(u.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(), T, l, F, E,
                      k, 4.0, 25.0, s, gu.data(), y.data());
  moe_experts_forward_reference(ref.data(), z.data(), idx.data(), w.data(), ex.e1.data(), ex.e3.data(), ex.e2.data(),
                                T, l, F, E, k, 4.0, 25.0, s, gur.data(), yr.data());
  test::expect_close(u.data(), ref.data(), T * l, 1e-5, 1e-4, "u");
  test::expect_close(gu.data(), gur.data(), int64_t(gu.size()), 1e-5, 1e-4, "saved [W1 z | W3 z]");
  test::expect_close(y.data(), yr.data(), int64_t(y.size()), 1e-5, 1e-4, "saved W2 SiTU");
}
