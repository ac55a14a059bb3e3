// AttnRes backward (kernels/attn_res.h) against central finite differences in double: four
// sources of different scales, non-zero pseudo-query w_p and norm gain w_n; every source
// and both parameter vectors; dsources and the parameter gradients accumulate (+=). Also
// float == double, and the zero pseudo-query (initial state) still passes gradient to w_p.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/attn_res.h"
#include "common/grad_check.h"

using namespace k3;
using test::check_fd;

namespace {

struct AttnResCase {
  int64_t T = 3, d = 16, S = 4;
  double eps = 1e-5;
  std::vector<std::vector<double>> src;
  std::vector<double> wn, wp, r;

  AttnResCase(unsigned seed, bool zero_query) {
    for (int64_t s = 0; s < S; ++s) src.push_back(test::randn(T * d, seed + unsigned(s), 0.5 * double(s + 1)));
    wn = test::randn(d, seed + 10, 0.3, 1.0);
    wp = test::randn(d, seed + 11, 0.5);
    if (zero_query) std::fill(wp.begin(), wp.end(), 0.0);
    r = test::randn(T * d, seed + 12);
  }
  std::vector<const double*> ptrs() const {
    std::vector<const double*> p;
    for (auto& s : src) p.push_back(s.data());
    return p;
  }
  double loss() const {
    std::vector<double> out(T * d);
    attn_res_forward<double>(out.data(), nullptr, ptrs().data(), S, wn.data(), wp.data(), T, d, eps);
    return test::dot(r, out);
  }
  // Gradients (accumulated onto random starts, which are subtracted again).
  void backward(std::vector<std::vector<double>>& dsrc, std::vector<double>& dwn, std::vector<double>& dwp) const {
    std::vector<double> out(T * d), alpha(T * S);
    attn_res_forward<double>(out.data(), alpha.data(), ptrs().data(), S, wn.data(), wp.data(), T, d, eps);
    std::vector<std::vector<double>> start;
    std::vector<double*> dp;
    dsrc.clear();
    for (int64_t s = 0; s < S; ++s) {
      start.push_back(test::randn(T * d, 100 + unsigned(s)));
      dsrc.push_back(start.back());
    }
    for (auto& v : dsrc) dp.push_back(v.data());
    const auto wn0 = test::randn(d, 200), wp0 = test::randn(d, 201);
    dwn = wn0, dwp = wp0;
    attn_res_backward<double>(dp.data(), dwn.data(), dwp.data(), r.data(), alpha.data(), ptrs().data(), S, wn.data(),
                              wp.data(), T, d, eps);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < T * d; ++i) dsrc[s][i] -= start[s][i];
    for (int64_t i = 0; i < d; ++i) dwn[i] -= wn0[i], dwp[i] -= wp0[i];
  }
};

}  // namespace

TEST(AttnResGrad, FourSourcesAgainstFiniteDifferences) {
  AttnResCase c(7, false);
  std::vector<std::vector<double>> dsrc;
  std::vector<double> dwn, dwp;
  c.backward(dsrc, dwn, dwp);
  auto loss = [&] { return c.loss(); };
  for (int64_t s = 0; s < c.S; ++s)
    check_fd(c.src[s], dsrc[s], loss, "d source " + std::to_string(s), 1e-6, 1 << 30);
  check_fd(c.wn, dwn, loss, "d w_norm", 1e-6, 1 << 30);
  check_fd(c.wp, dwp, loss, "d w_proj", 1e-6, 1 << 30);
}

TEST(AttnResGrad, ZeroPseudoQueryStillLearns) {
  // At initialisation w_p = 0 (uniform mixing): w_n has no gradient, w_p does.
  AttnResCase c(17, true);
  std::vector<std::vector<double>> dsrc;
  std::vector<double> dwn, dwp;
  c.backward(dsrc, dwn, dwp);
  auto loss = [&] { return c.loss(); };
  check_fd(c.wp, dwp, loss, "d w_proj at w_p = 0", 1e-6, 1 << 30);
  for (int64_t i = 0; i < c.d; ++i) EXPECT_NEAR(dwn[i], 0.0, 1e-14);
  for (int64_t s = 0; s < c.S; ++s) check_fd(c.src[s], dsrc[s], loss, "d source at w_p = 0", 1e-6, 1 << 30);
}

TEST(AttnResGrad, FloatMatchesDouble) {
  AttnResCase c(27, false);
  std::vector<std::vector<double>> dsrc;
  std::vector<double> dwn, dwp;
  c.backward(dsrc, dwn, dwp);
  std::vector<std::vector<float>> sf, dsf;
  std::vector<const float*> ps;
  std::vector<float*> pd;
  for (int64_t s = 0; s < c.S; ++s) {
    sf.push_back(test::cast<float>(c.src[s]));
    dsf.emplace_back(c.T * c.d, 0.f);
  }
  for (int64_t s = 0; s < c.S; ++s) ps.push_back(sf[s].data()), pd.push_back(dsf[s].data());
  auto wn = test::cast<float>(c.wn), wp = test::cast<float>(c.wp), r = test::cast<float>(c.r);
  std::vector<float> out(c.T * c.d), alpha(c.T * c.S), dwnf(c.d, 0.f), dwpf(c.d, 0.f);
  attn_res_forward<float>(out.data(), alpha.data(), ps.data(), c.S, wn.data(), wp.data(), c.T, c.d, c.eps);
  attn_res_backward<float>(pd.data(), dwnf.data(), dwpf.data(), r.data(), alpha.data(), ps.data(), c.S, wn.data(),
                           wp.data(), c.T, c.d, c.eps);
  for (int64_t s = 0; s < c.S; ++s) EXPECT_LT(test::rel_rms_mixed(dsf[s].data(), dsrc[s].data(), c.T * c.d), 1e-5);
  EXPECT_LT(test::rel_rms_mixed(dwnf.data(), dwn.data(), c.d), 1e-5);
  EXPECT_LT(test::rel_rms_mixed(dwpf.data(), dwp.data(), c.d), 1e-5);
}
