// Routed experts backward (kernels/moe.h): the plain reference against central finite
// differences in double (dz, the mixture weights, every expert's w1/w3/w2, gradients
// accumulating onto non-zero starts); the grouped float path against the double reference
// (experts without tokens are never touched: their gradient pointers may even be null);
// bitwise determinism across thread counts.
#include <gtest/gtest.h>

#include <vector>

#include "common/fixture.h"
#include "core/threads.h"
#include "kernels/moe.h"
#include "kernels/router.h"
#include "common/grad_check.h"

using namespace k3;
using test::check_fd;

namespace {

template <typename R>
struct ExpertSet {
  int64_t E, F, l;
  std::vector<std::vector<R>> w1, w3, w2, g1, g3, g2;
  std::vector<ExpertMatrixT<R>> m1, m3, m2;
  std::vector<ExpertGradT<R>> grads;

  ExpertSet(int64_t E_, int64_t F_, int64_t l_, unsigned seed) : E(E_), F(F_), l(l_) {
    for (int64_t e = 0; e < E; ++e) {
      w1.push_back(test::cast<R>(test::randn(F * l, seed + 3 * unsigned(e), 0.6)));
      w3.push_back(test::cast<R>(test::randn(F * l, seed + 3 * unsigned(e) + 1, 3.0)));  // saturate the up cap a bit
      w2.push_back(test::cast<R>(test::randn(l * F, seed + 3 * unsigned(e) + 2, 0.4)));
      g1.push_back(test::cast<R>(test::randn(F * l, 500 + unsigned(e))));  // non-zero: gradients accumulate
      g3.push_back(test::cast<R>(test::randn(F * l, 600 + unsigned(e))));
      g2.push_back(test::cast<R>(test::randn(l * F, 700 + unsigned(e))));
    }
    refresh();
  }
  void refresh() {
    m1.clear(), m3.clear(), m2.clear(), grads.clear();
    for (int64_t e = 0; e < E; ++e) {
      m1.push_back({w1[e].data(), nullptr, F, l});
      m3.push_back({w3[e].data(), nullptr, F, l});
      m2.push_back({w2[e].data(), nullptr, l, F});
      grads.push_back({g1[e].data(), g3[e].data(), g2[e].data()});
    }
  }
};

// Random routing: k distinct experts per token from the scores of a random router.
std::vector<int32_t> random_routing(int64_t T, int64_t E, int64_t k, int64_t dead, unsigned seed) {
  auto s = test::randn(T * E, seed);
  std::vector<double> bias(E, 0.0);
  for (int64_t e = E - dead; e < E; ++e) bias[e] = -100;
  std::vector<int32_t> idx(T * k);
  for (int64_t t = 0; t < T; ++t) router_select_topk<double>(idx.data() + t * k, s.data() + t * E, bias.data(), E, k);
  return idx;
}

}  // namespace

TEST(MoEExpertsGrad, ReferenceAgainstFiniteDifferences) {
  const int64_t E = 4, F = 5, l = 6, T = 5, k = 2;
  ExpertSet<double> ex(E, F, l, 1);
  auto z = test::randn(T * l, 2), p = test::randn(T * k, 3, 0.3, 0.5), r = test::randn(T * l, 4);
  const auto idx = random_routing(T, E, k, 0, 5);
  MoEExpertScratch scratch;
  auto loss = [&] {
    std::vector<double> u(T * l);
    moe_experts_forward_reference<double>(u.data(), z.data(), idx.data(), p.data(), ex.m1.data(), ex.m3.data(),
                                          ex.m2.data(), T, l, F, E, k, 4.0, 25.0, scratch);
    return test::dot(r, u);
  };
  auto start = ex;  // gradient starts, to subtract
  std::vector<double> dz(T * l, 9.0), dp(T * k, 9.0);  // assigned
  moe_experts_backward_reference<double>(dz.data(), dp.data(), ex.grads.data(), r.data(), nullptr, nullptr, z.data(),
                                         idx.data(), p.data(), ex.m1.data(), ex.m3.data(), ex.m2.data(), T, l, F, E, k,
                                         4.0, 25.0, scratch);
  check_fd(z, dz, loss, "experts dz", 1e-6, 1 << 30);
  check_fd(p, dp, loss, "experts d topk_w", 1e-6, 1 << 30);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<double> d1(F * l), d3(F * l), d2(l * F);
    for (int64_t i = 0; i < F * l; ++i) {
      d1[i] = ex.g1[e][i] - start.g1[e][i];
      d3[i] = ex.g3[e][i] - start.g3[e][i];
      d2[i] = ex.g2[e][i] - start.g2[e][i];
    }
    const std::string tag = "expert " + std::to_string(e);
    check_fd(ex.w1[e], d1, loss, tag + " dw1", 1e-6, 40);
    check_fd(ex.w3[e], d3, loss, tag + " dw3", 1e-6, 40);
    check_fd(ex.w2[e], d2, loss, tag + " dw2", 1e-6, 40);
  }
}

TEST(MoEExpertsGrad, GroupedMatchesReferenceAndSkipsEmptyExperts) {
  const int64_t E = 16, F = 24, l = 20, T = 30, k = 4, dead = 3;
  ExpertSet<double> exd(E, F, l, 11);
  auto z = test::randn(T * l, 12), p = test::randn(T * k, 13, 0.2, 0.4), r = test::randn(T * l, 14);
  const auto idx = random_routing(T, E, k, dead, 15);
  MoEExpertScratch scratch;
  std::vector<double> dz(T * l), dp(T * k);
  auto startd = exd;
  moe_experts_backward_reference<double>(dz.data(), dp.data(), exd.grads.data(), r.data(), nullptr, nullptr, z.data(),
                                         idx.data(), p.data(), exd.m1.data(), exd.m3.data(), exd.m2.data(), T, l, F, E,
                                         k, 4.0, 25.0, scratch);
  // Float grouped, from its own forward's saved gu and y.
  ExpertSet<float> exf(E, F, l, 11);
  for (int64_t e = E - dead; e < E; ++e) exf.grads[e] = {};  // never touched
  auto zf = test::cast<float>(z), pf = test::cast<float>(p), rf = test::cast<float>(r);
  std::vector<float> u(T * l), gu(T * k * 2 * F), y(T * k * l), dzf(T * l), dpf(T * k);
  moe_experts_forward(u.data(), zf.data(), idx.data(), pf.data(), exf.m1.data(), exf.m3.data(), exf.m2.data(), T, l, F,
                      E, k, 4.0, 25.0, scratch, gu.data(), y.data());
  // The saved rows are what the reference forward saves too.
  std::vector<float> ur(T * l), gur(T * k * 2 * F), yr(T * k * l);
  moe_experts_forward_reference<float>(ur.data(), zf.data(), idx.data(), pf.data(), exf.m1.data(), exf.m3.data(),
                                       exf.m2.data(), T, l, F, E, k, 4.0, 25.0, scratch, gur.data(), yr.data());
  EXPECT_LT(test::rel_rms(gu.data(), gur.data(), int64_t(gu.size())), 1e-6);
  EXPECT_LT(test::rel_rms(y.data(), yr.data(), int64_t(y.size())), 1e-6);
  moe_experts_backward(dzf.data(), dpf.data(), exf.grads.data(), rf.data(), gu.data(), y.data(), zf.data(), idx.data(),
                       pf.data(), exf.m1.data(), exf.m3.data(), exf.m2.data(), T, l, F, E, k, 4.0, 25.0, scratch);
  EXPECT_LT(test::rel_rms_mixed(dzf.data(), dz.data(), T * l), 1e-5);
  EXPECT_LT(test::rel_rms_mixed(dpf.data(), dp.data(), T * k), 1e-5);
  auto start_f = ExpertSet<float>(E, F, l, 11);
  for (int64_t e = 0; e < E - dead; ++e) {
    auto diff = [&](const std::vector<float>& got, const std::vector<float>& g0, const std::vector<double>& want,
                    const std::vector<double>& w0, const char* name) {
      std::vector<double> gd(got.size()), wd(got.size());
      for (size_t i = 0; i < got.size(); ++i) gd[i] = double(got[i]) - double(g0[i]), wd[i] = want[i] - w0[i];
      EXPECT_LT(test::rel_rms(gd.data(), wd.data(), int64_t(gd.size())), 1e-5) << "expert " << e << " " << name;
    };
    diff(exf.g1[e], start_f.g1[e], exd.g1[e], startd.g1[e], "dw1");
    diff(exf.g3[e], start_f.g3[e], exd.g3[e], startd.g3[e], "dw3");
    diff(exf.g2[e], start_f.g2[e], exd.g2[e], startd.g2[e], "dw2");
  }
}

TEST(MoEExpertsGrad, GroupedIsDeterministicAcrossThreads) {
  const int64_t E = 12, F = 16, l = 16, T = 40, k = 3;
  const auto idx = random_routing(T, E, k, 0, 31);
  auto z = test::cast<float>(test::randn(T * l, 32)), p = test::cast<float>(test::randn(T * k, 33, 0.2, 0.4)),
       r = test::cast<float>(test::randn(T * l, 34));
  auto run = [&](int threads) {
    ExpertSet<float> ex(E, F, l, 35);
    MoEExpertScratch s;
    std::vector<float> u(T * l), gu(T * k * 2 * F), y(T * k * l), dz(T * l), dp(T * k);
    const int before = num_threads();
    set_num_threads(threads);
    moe_experts_forward(u.data(), z.data(), idx.data(), p.data(), ex.m1.data(), ex.m3.data(), ex.m2.data(), T, l, F, E,
                        k, 4.0, 25.0, s, gu.data(), y.data());
    moe_experts_backward(dz.data(), dp.data(), ex.grads.data(), r.data(), gu.data(), y.data(), z.data(), idx.data(),
                         p.data(), ex.m1.data(), ex.m3.data(), ex.m2.data(), T, l, F, E, k, 4.0, 25.0, s);
    set_num_threads(before);
    std::vector<float> all = dz;
    all.insert(all.end(), dp.begin(), dp.end());
    for (int64_t e = 0; e < E; ++e) {
      all.insert(all.end(), ex.g1[e].begin(), ex.g1[e].end());
      all.insert(all.end(), ex.g3[e].begin(), ex.g3[e].end());
      all.insert(all.end(), ex.g2[e].begin(), ex.g2[e].end());
    }
    return all;
  };
  const auto a = run(1), b = run(2);
  EXPECT_EQ(a, b);
}
