// Dense SiTU-GLU FFN backward (model/dense_ffn.h) against central finite differences in
// double: dx (assigned, or accumulated with accumulate_dx), and the gate/up/down gradients
// accumulating onto non-zero starts; inputs large enough that both SiTU caps bend. Float
// agrees with double.
#include <gtest/gtest.h>

#include <vector>

#include "common/grad_check.h"
#include "model/dense_ffn.h"

using namespace k3;
using test::check_fd;

TEST(DenseFFNGrad, AgainstFiniteDifferences) {
  const int64_t T = 4, d = 9, I = 11;
  auto x = test::randn(T * d, 1), G = test::randn(I * d, 2, 1.2), U = test::randn(I * d, 3, 6.0),
       D = test::randn(d * I, 4, 0.3), r = test::randn(T * d, 5);
  auto loss = [&] {
    std::vector<double> y(T * d), gu(T * 2 * I), act(T * I);
    dense_ffn_forward<double>(y.data(), gu.data(), act.data(), x.data(), G.data(), U.data(), D.data(), T, d, I, 4.0,
                              25.0);
    return test::dot(r, y);
  };
  std::vector<double> y(T * d), gu(T * 2 * I), act(T * I), dgu(T * 2 * I), dact(T * I);
  dense_ffn_forward<double>(y.data(), gu.data(), act.data(), x.data(), G.data(), U.data(), D.data(), T, d, I, 4.0,
                            25.0);
  const auto g0 = test::randn(I * d, 6), u0 = test::randn(I * d, 7), d0 = test::randn(d * I, 8),
             x0 = test::randn(T * d, 9);
  auto dG = g0, dU = u0, dD = d0;
  std::vector<double> dx(T * d, 5.0);  // assigned
  dense_ffn_backward<double>(dx.data(), dG.data(), dU.data(), dD.data(), dgu.data(), dact.data(), r.data(), gu.data(),
                             act.data(), x.data(), G.data(), U.data(), D.data(), T, d, I, 4.0, 25.0);
  for (int64_t i = 0; i < I * d; ++i) dG[i] -= g0[i], dU[i] -= u0[i], dD[i] -= d0[i];
  check_fd(x, dx, loss, "ffn dx", 1e-6, 1 << 30);
  check_fd(G, dG, loss, "ffn d gate", 1e-6, 1 << 30);
  check_fd(U, dU, loss, "ffn d up", 1e-6, 1 << 30);
  check_fd(D, dD, loss, "ffn d down", 1e-6, 1 << 30);
  // accumulate_dx adds onto what is there.
  auto dxa = x0;
  auto dG2 = dG, dU2 = dU, dD2 = dD;
  dense_ffn_backward<double>(dxa.data(), dG2.data(), dU2.data(), dD2.data(), dgu.data(), dact.data(), r.data(),
                             gu.data(), act.data(), x.data(), G.data(), U.data(), D.data(), T, d, I, 4.0, 25.0, true);
  for (int64_t i = 0; i < T * d; ++i) EXPECT_NEAR(dxa[i], x0[i] + dx[i], 1e-12 * (1 + std::fabs(dx[i])));
  // Float instantiation.
  auto xf = test::cast<float>(x), Gf = test::cast<float>(G), Uf = test::cast<float>(U), Df = test::cast<float>(D),
       rf = test::cast<float>(r);
  std::vector<float> yf(T * d), guf(T * 2 * I), actf(T * I), dguf(T * 2 * I), dactf(T * I), dxf(T * d),
      dGf(I * d, 0.f), dUf(I * d, 0.f), dDf(d * I, 0.f);
  dense_ffn_forward<float>(yf.data(), guf.data(), actf.data(), xf.data(), Gf.data(), Uf.data(), Df.data(), T, d, I, 4.0,
                           25.0);
  dense_ffn_backward<float>(dxf.data(), dGf.data(), dUf.data(), dDf.data(), dguf.data(), dactf.data(), rf.data(),
                            guf.data(), actf.data(), xf.data(), Gf.data(), Uf.data(), Df.data(), T, d, I, 4.0, 25.0);
  EXPECT_LT(test::rel_rms_mixed(dxf.data(), dx.data(), T * d), 1e-5);
  EXPECT_LT(test::rel_rms_mixed(dGf.data(), dG.data(), I * d), 1e-5);
  EXPECT_LT(test::rel_rms_mixed(dUf.data(), dU.data(), I * d), 1e-5);
  EXPECT_LT(test::rel_rms_mixed(dDf.data(), dD.data(), d * I), 1e-5);
}
