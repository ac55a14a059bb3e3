// Router backward (kernels/router.h) against central finite differences in double: the
// gradient flows through the unbiased sigmoid scores of the selected experts and the
// renormalisation; a balancing bias that changes the selection gets no gradient (its finite
// difference is exactly zero at a fixed selection); the auxiliary-loss hook (dscores) and
// router_aux_loss's value and gradient. Inputs have selection margins far above the FD step,
// and every loss evaluation asserts that the selection did not change.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/router.h"
#include "common/grad_check.h"

using namespace k3;
using test::check_fd;

namespace {

struct RouterCase {
  int64_t T = 7, d = 10, E = 8, k = 3;
  bool renorm = true;
  double scale = 2.5;
  std::vector<double> x, W, b, r;
  std::vector<int32_t> idx0;

  RouterCase(bool renorm_, unsigned seed) : renorm(renorm_) {
    x = test::randn(T * d, seed);
    W = test::randn(E * d, seed + 1, 0.4);
    b = test::randn(E, seed + 2, 0.15);
    r = test::randn(T * k, seed + 3);
    std::vector<double> w(T * k), s(T * E);
    idx0.resize(T * k);
    router_forward<double>(idx0.data(), w.data(), s.data(), x.data(), W.data(), b.data(), T, d, E, k, renorm, scale);
  }
  // Smallest gap between the k-th and (k+1)-th biased score over the tokens.
  double min_margin() const {
    std::vector<int32_t> idx(T * k);
    std::vector<double> w(T * k), s(T * E);
    router_forward<double>(idx.data(), w.data(), s.data(), x.data(), W.data(), b.data(), T, d, E, k, renorm, scale);
    double m = 1e9;
    for (int64_t t = 0; t < T; ++t) {
      double kth = s[t * E + idx[t * k + k - 1]] + b[idx[t * k + k - 1]], next = -1e9;
      for (int64_t e = 0; e < E; ++e) {
        bool sel = false;
        for (int64_t i = 0; i < k; ++i) sel = sel || idx[t * k + i] == e;
        if (!sel) next = std::max(next, s[t * E + e] + b[e]);
      }
      m = std::min(m, kth - next);
    }
    return m;
  }
  // Forward; fails the test if the selection moved away from idx0.
  void forward(std::vector<double>& w, std::vector<double>& s) const {
    std::vector<int32_t> idx(T * k);
    w.resize(T * k);
    s.resize(T * E);
    router_forward<double>(idx.data(), w.data(), s.data(), x.data(), W.data(), b.data(), T, d, E, k, renorm, scale);
    EXPECT_EQ(idx, idx0) << "the finite-difference step changed the selection";
  }
};

}  // namespace

// L = r . topk_w + alpha E sum_j f_j P_j (the auxiliary loss, through the dscores hook).
TEST(RouterGrad, RenormWithSelectionChangingBiasAndAuxLoss) {
  RouterCase c(true, 11);
  ASSERT_GT(c.min_margin(), 1e-3);
  // The bias changes the selection in some rows (so it is exercised), yet gets no gradient.
  {
    std::vector<int32_t> nob(c.T * c.k);
    std::vector<double> w(c.T * c.k), s(c.T * c.E);
    router_forward<double>(nob.data(), w.data(), s.data(), c.x.data(), c.W.data(), nullptr, c.T, c.d, c.E, c.k, true,
                           c.scale);
    int changed = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t i = 0; i < c.k; ++i) changed += nob[t * c.k + i] != c.idx0[t * c.k + i];
    ASSERT_GT(changed, 0) << "pick a seed whose bias changes the selection";
  }
  const double alpha = 0.3;
  auto loss = [&]() {
    std::vector<double> w, s;
    c.forward(w, s);
    return test::dot(c.r, w) + router_aux_loss<double>(nullptr, c.idx0.data(), s.data(), c.T, c.E, c.k, alpha);
  };
  std::vector<double> w, s;
  c.forward(w, s);
  std::vector<double> ds(c.T * c.E), dl(c.T * c.E);
  router_aux_loss<double>(ds.data(), c.idx0.data(), s.data(), c.T, c.E, c.k, alpha);
  // Accumulation: dx and dW_r start non-zero.
  const auto dx0 = test::randn(c.T * c.d, 91), dW0 = test::randn(c.E * c.d, 92);
  auto dx = dx0, dW = dW0;
  router_backward<double>(dx.data(), dW.data(), dl.data(), c.r.data(), ds.data(), c.idx0.data(), s.data(), c.x.data(),
                          c.W.data(), c.T, c.d, c.E, c.k, true, c.scale);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx0[i];
  for (size_t i = 0; i < dW.size(); ++i) dW[i] -= dW0[i];
  check_fd(c.x, dx, loss, "router dx", 1e-6, 1 << 30);
  check_fd(c.W, dW, loss, "router dW_r", 1e-6, 1 << 30);
  // The bias: its finite difference is exactly zero at a fixed selection (only selects).
  const double L0 = loss();
  for (int64_t e = 0; e < c.E; ++e) {
    const double keep = c.b[e];
    c.b[e] = keep + 1e-5;
    const double lp = loss();
    c.b[e] = keep - 1e-5;
    const double lm = loss();
    c.b[e] = keep;
    EXPECT_EQ(lp, L0) << "bias " << e;
    EXPECT_EQ(lm, L0) << "bias " << e;
  }
}

// No renormalisation; the hook adds an arbitrary d(scores) for every expert, selected or not.
TEST(RouterGrad, NoRenormWithScoreHook) {
  RouterCase c(false, 23);
  ASSERT_GT(c.min_margin(), 1e-3);
  const auto q = test::randn(c.T * c.E, 24);
  auto loss = [&]() {
    std::vector<double> w, s;
    c.forward(w, s);
    return test::dot(c.r, w) + test::dot(q, s);
  };
  std::vector<double> w, s;
  c.forward(w, s);
  std::vector<double> dx(c.T * c.d, 0.0), dW(c.E * c.d, 0.0), dl(c.T * c.E);
  router_backward<double>(dx.data(), dW.data(), dl.data(), c.r.data(), q.data(), c.idx0.data(), s.data(), c.x.data(),
                          c.W.data(), c.T, c.d, c.E, c.k, false, c.scale);
  check_fd(c.x, dx, loss, "router dx (no renorm)", 1e-6, 1 << 30);
  check_fd(c.W, dW, loss, "router dW_r (no renorm)", 1e-6, 1 << 30);
  // Without the hook only the selected experts' logits get a gradient.
  router_backward<double>(dx.data(), dW.data(), dl.data(), c.r.data(), nullptr, c.idx0.data(), s.data(), c.x.data(),
                          c.W.data(), c.T, c.d, c.E, c.k, false, c.scale);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t e = 0; e < c.E; ++e) {
      bool sel = false;
      for (int64_t i = 0; i < c.k; ++i) sel = sel || c.idx0[t * c.k + i] == e;
      if (!sel) {
        EXPECT_EQ(dl[t * c.E + e], 0.0);
      }
    }
}

TEST(RouterGrad, AuxLossValueAndGradient) {
  // Hand value: T = 2, E = 2, k = 1, both tokens pick expert 0: f = (1, 0);
  // P_0 = (0.6/0.8 + 0.3/0.6) / 2 = 0.625, L = alpha E f_0 P_0 = 1.25 alpha.
  {
    const int32_t idx[2] = {0, 0};
    const double s[4] = {0.6, 0.2, 0.3, 0.3};
    EXPECT_NEAR(router_aux_loss<double>(nullptr, idx, s, 2, 2, 1, 0.1), 0.125, 1e-15);
  }
  // Balanced routing (each expert chosen equally, equal scores) gives exactly alpha.
  {
    const int64_t T = 4, E = 4, k = 2;
    const int32_t idx[T * k] = {0, 1, 2, 3, 1, 2, 3, 0};
    std::vector<double> s(T * E, 0.37);
    EXPECT_NEAR(router_aux_loss<double>(nullptr, idx, s.data(), T, E, k, 0.01), 0.01, 1e-15);
  }
  // Gradient w.r.t. the scores (counts fixed) against finite differences.
  const int64_t T = 5, E = 6, k = 2;
  std::vector<double> s(T * E);
  auto sr = test::randn(T * E, 5);
  for (int64_t i = 0; i < T * E; ++i) s[i] = 1 / (1 + std::exp(-sr[i]));
  std::vector<int32_t> idx(T * k);
  for (int64_t t = 0; t < T; ++t) router_select_topk<double>(idx.data() + t * k, s.data() + t * E, nullptr, E, k);
  std::vector<double> ds(T * E);
  const double L = router_aux_loss<double>(ds.data(), idx.data(), s.data(), T, E, k, 0.7);
  check_fd(s, ds, [&] { return router_aux_loss<double>(nullptr, idx.data(), s.data(), T, E, k, 0.7); },
           "aux loss d scores", 1e-6, 1 << 30);
  // Float instantiation agrees.
  auto sf = test::cast<float>(s);
  std::vector<float> dsf(T * E);
  EXPECT_NEAR(router_aux_loss<float>(dsf.data(), idx.data(), sf.data(), T, E, k, 0.7), L, 1e-6);
  EXPECT_LT(test::rel_rms_mixed(dsf.data(), ds.data(), T * E), 1e-5);
}

TEST(RouterGrad, FloatMatchesDouble) {
  RouterCase c(true, 31);
  ASSERT_GT(c.min_margin(), 1e-3);
  std::vector<double> w, s;
  c.forward(w, s);
  std::vector<double> dx(c.T * c.d, 0.0), dW(c.E * c.d, 0.0), dl(c.T * c.E);
  router_backward<double>(dx.data(), dW.data(), dl.data(), c.r.data(), nullptr, c.idx0.data(), s.data(), c.x.data(),
                          c.W.data(), c.T, c.d, c.E, c.k, true, c.scale);
  auto xf = test::cast<float>(c.x), Wf = test::cast<float>(c.W), bf = test::cast<float>(c.b),
       rf = test::cast<float>(c.r);
  std::vector<int32_t> idx(c.T * c.k);
  std::vector<float> wf(c.T * c.k), sf(c.T * c.E), dxf(c.T * c.d, 0.f), dWf(c.E * c.d, 0.f), dlf(c.T * c.E);
  router_forward<float>(idx.data(), wf.data(), sf.data(), xf.data(), Wf.data(), bf.data(), c.T, c.d, c.E, c.k, true,
                        c.scale);
  ASSERT_EQ(idx, c.idx0);
  router_backward<float>(dxf.data(), dWf.data(), dlf.data(), rf.data(), nullptr, idx.data(), sf.data(), xf.data(),
                         Wf.data(), c.T, c.d, c.E, c.k, true, c.scale);
  EXPECT_LT(test::rel_rms_mixed(dxf.data(), dx.data(), c.T * c.d), 1e-5);
  EXPECT_LT(test::rel_rms_mixed(dWf.data(), dW.data(), c.E * c.d), 1e-5);
}
