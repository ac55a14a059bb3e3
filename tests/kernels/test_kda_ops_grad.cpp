// Backward of the KDA mixer's own ops against central finite differences in double:
// shortconv_silu_backward (kernels/shortconv.h: dx, dw, the incoming conv state; sequences
// longer and shorter than K-1; two channel blocks) and kda_gate_backward (kernels/kda_gate.h:
// bounded and unbounded, dz, A_log per head, dt_bias). The loss is L = sum(r * y) for a fixed
// random r, so dL/dy = r. Parameter gradients must accumulate: they start non-zero. Then
// float == double, and threaded == one thread above the OpenMP thresholds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "core/threads.h"
#include "kernels/kda_gate.h"
#include "kernels/shortconv.h"

using namespace k3;

namespace {

std::vector<double> randn(int64_t n, unsigned seed, double sd = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0, sd);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& e : v) e = d(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss() w.r.t. every entry of p, compared with grad by relative
// error max|fd - grad| / max(max|fd|, tiny).
void check_fd(std::vector<double>& p, const std::vector<double>& grad, const std::function<double()>& loss,
              const std::string& what, double tol = 1e-6) {
  ASSERT_EQ(p.size(), grad.size()) << what;
  const double h = 1e-5;
  double err = 0, scale = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double keep = p[i];
    p[i] = keep + h;
    const double lp = loss();
    p[i] = keep - h;
    const double lm = loss();
    p[i] = keep;
    const double fd = (lp - lm) / (2 * h);
    ASSERT_TRUE(std::isfinite(grad[i])) << what << " [" << i << "]";
    err = std::max(err, std::fabs(fd - grad[i]));
    scale = std::max(scale, std::fabs(fd));
  }
  ASSERT_GT(scale, 1e-8) << what << ": gradient is all zero, the check would be vacuous";
  EXPECT_LT(err / scale, tol) << what << " max abs err " << err << " scale " << scale;
}

void shortconv_case(int64_t C, int64_t K, int64_t T, bool with_state, unsigned seed) {
  const int64_t P = K - 1;
  auto x = randn(T * C, seed), w = randn(C * K, seed + 1, 0.7), s0 = randn(C * P, seed + 2),
       r = randn(T * C, seed + 3);
  if (!with_state) std::fill(s0.begin(), s0.end(), 0.0);
  auto loss = [&]() {
    std::vector<double> y(T * C), st = s0;
    shortconv_silu_forward<double>(y.data(), nullptr, st.data(), x.data(), w.data(), T, C, K);
    return dot(r, y);
  };
  std::vector<double> y(T * C), pre(T * C), st = s0;
  shortconv_silu_forward<double>(y.data(), pre.data(), st.data(), x.data(), w.data(), T, C, K);
  const auto dw0 = randn(C * K, seed + 4);  // accumulate onto this
  std::vector<double> dx(T * C), dw = dw0, ds(C * P);
  shortconv_silu_backward<double>(dx.data(), dw.data(), ds.data(), r.data(), pre.data(),
                                  with_state ? s0.data() : nullptr, x.data(), w.data(), T, C, K);
  for (int64_t i = 0; i < C * K; ++i) dw[i] -= dw0[i];
  const std::string tag = "C=" + std::to_string(C) + " K=" + std::to_string(K) + " T=" + std::to_string(T);
  check_fd(x, dx, loss, tag + " dx");
  check_fd(w, dw, loss, tag + " dw");
  if (P > 0) check_fd(s0, ds, loss, tag + " dstate0");
  // dstate0 may be null; dx and dw are unchanged.
  std::vector<double> dx2(T * C), dw2(C * K, 0.0);
  shortconv_silu_backward<double>(dx2.data(), dw2.data(), nullptr, r.data(), pre.data(),
                                  with_state ? s0.data() : nullptr, x.data(), w.data(), T, C, K);
  for (int64_t i = 0; i < T * C; ++i) EXPECT_EQ(dx2[i], dx[i]) << tag << " dx without dstate0";
  for (int64_t i = 0; i < C * K; ++i) EXPECT_NEAR(dw2[i], dw[i], 1e-12) << tag << " dw without dstate0";
}

void gate_case(bool bounded, unsigned seed) {
  const int64_t T = 5, H = 3, D = 4, HD = H * D;
  const double lb = -5.0;
  auto z = randn(T * HD, seed, 2.0), A = randn(H, seed + 1, 0.5), b = randn(HD, seed + 2), r = randn(T * HD, seed + 3);
  auto loss = [&]() {
    std::vector<double> g(T * HD);
    kda_gate_forward<double>(g.data(), z.data(), A.data(), b.data(), T, H, D, bounded, lb);
    return dot(r, g);
  };
  const auto dA0 = randn(H, seed + 4), db0 = randn(HD, seed + 5);
  std::vector<double> dz(T * HD), dA = dA0, db = db0;
  kda_gate_backward<double>(dz.data(), dA.data(), db.data(), r.data(), z.data(), A.data(), b.data(), T, H, D, bounded,
                            lb);
  for (int64_t h = 0; h < H; ++h) dA[h] -= dA0[h];
  for (int64_t c = 0; c < HD; ++c) db[c] -= db0[c];
  const std::string tag = bounded ? "bounded" : "unbounded";
  check_fd(z, dz, loss, tag + " dz");
  check_fd(A, dA, loss, tag + " dA_log");
  check_fd(b, db, loss, tag + " ddt_bias");
  // dz may alias dg.
  std::vector<double> inplace = r, dA2(H, 0.0), db2(HD, 0.0);
  kda_gate_backward<double>(inplace.data(), dA2.data(), db2.data(), inplace.data(), z.data(), A.data(), b.data(), T,
                            H, D, bounded, lb);
  for (int64_t i = 0; i < T * HD; ++i) EXPECT_EQ(inplace[i], dz[i]) << tag << " in place";
}

}  // namespace

TEST(KDAOpsGrad, ShortConvMatchesFiniteDifferences) {
  shortconv_case(5, 4, 11, true, 10);   // the K3 kernel, state carried in
  shortconv_case(5, 4, 11, false, 20);  // fresh sequence (state0 null)
  shortconv_case(6, 4, 2, true, 30);    // fewer tokens than K-1: part of the state reaches past x
  shortconv_case(70, 3, 7, true, 40);   // two channel blocks (64 + 6)
  shortconv_case(4, 1, 5, false, 50);   // K = 1: no state
}

TEST(KDAOpsGrad, GateBoundedMatchesFiniteDifferences) { gate_case(true, 60); }

TEST(KDAOpsGrad, GateUnboundedMatchesFiniteDifferences) { gate_case(false, 70); }

// The float instantiations agree with double on the same inputs.
TEST(KDAOpsGrad, FloatEqualsDouble) {
  const int64_t C = 67, K = 4, T = 9, P = K - 1;
  auto x = randn(T * C, 1), w = randn(C * K, 2, 0.7), s0 = randn(C * P, 3), r = randn(T * C, 4);
  std::vector<double> y(T * C), pre(T * C), st = s0, dx(T * C), dw(C * K, 0.0), ds(C * P);
  shortconv_silu_forward<double>(y.data(), pre.data(), st.data(), x.data(), w.data(), T, C, K);
  shortconv_silu_backward<double>(dx.data(), dw.data(), ds.data(), r.data(), pre.data(), s0.data(), x.data(),
                                  w.data(), T, C, K);
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  auto xf = f(x), wf = f(w), s0f = f(s0), rf = f(r), stf = s0f;
  std::vector<float> yf(T * C), pref(T * C), dxf(T * C), dwf(C * K, 0.0f), dsf(C * P);
  shortconv_silu_forward<float>(yf.data(), pref.data(), stf.data(), xf.data(), wf.data(), T, C, K);
  shortconv_silu_backward<float>(dxf.data(), dwf.data(), dsf.data(), rf.data(), pref.data(), s0f.data(), xf.data(),
                                 wf.data(), T, C, K);
  auto close = [](const std::vector<float>& a, const std::vector<double>& b, const char* what) {
    std::vector<float> bf(b.begin(), b.end());
    EXPECT_LT(test::rel_rms(a.data(), bf.data(), int64_t(a.size())), 1e-5) << what;
  };
  close(dxf, dx, "shortconv dx");
  close(dwf, dw, "shortconv dw");
  close(dsf, ds, "shortconv dstate0");

  const int64_t H = 3, D = 5, HD = H * D;
  auto z = randn(T * HD, 5, 2.0), A = randn(H, 6, 0.5), b = randn(HD, 7), rg = randn(T * HD, 8);
  for (bool bounded : {true, false}) {
    std::vector<double> dz(T * HD), dA(H, 0.0), db(HD, 0.0);
    kda_gate_backward<double>(dz.data(), dA.data(), db.data(), rg.data(), z.data(), A.data(), b.data(), T, H, D,
                              bounded, -5.0);
    auto zf = f(z), Af = f(A), bf = f(b), rgf = f(rg);
    std::vector<float> dzf(T * HD), dAf(H, 0.0f), dbf(HD, 0.0f);
    kda_gate_backward<float>(dzf.data(), dAf.data(), dbf.data(), rgf.data(), zf.data(), Af.data(), bf.data(), T, H,
                             D, bounded, -5.0);
    close(dzf, dz, bounded ? "gate dz bounded" : "gate dz unbounded");
    close(dAf, dA, bounded ? "gate dA_log bounded" : "gate dA_log unbounded");
    close(dbf, db, bounded ? "gate ddt_bias bounded" : "gate ddt_bias unbounded");
  }
}

// Above the OpenMP thresholds (channel blocks of the conv, heads of the gate) the threaded
// backward equals the one-thread backward exactly: each thread owns its channels / heads.
TEST(KDAOpsGrad, ThreadedEqualsOneThread) {
  const int64_t C = 1100, K = 4, T = 64, P = K - 1;  // T * C * K > 262144
  auto x = randn(T * C, 1), w = randn(C * K, 2, 0.7), s0 = randn(C * P, 3), r = randn(T * C, 4);
  std::vector<double> y(T * C), pre(T * C), st = s0;
  shortconv_silu_forward<double>(y.data(), pre.data(), st.data(), x.data(), w.data(), T, C, K);
  const int64_t H = 8, D = 128, Tg = 80, HD = H * D;  // Tg * HD > 65536
  auto z = randn(Tg * HD, 5, 2.0), A = randn(H, 6, 0.5), b = randn(HD, 7), rg = randn(Tg * HD, 8);
  auto run = [&](std::vector<double>& out) {
    std::vector<double> dx(T * C), dw(C * K, 0.0), ds(C * P), dz(Tg * HD), dA(H, 0.0), db(HD, 0.0);
    shortconv_silu_backward<double>(dx.data(), dw.data(), ds.data(), r.data(), pre.data(), s0.data(), x.data(),
                                    w.data(), T, C, K);
    kda_gate_backward<double>(dz.data(), dA.data(), db.data(), rg.data(), z.data(), A.data(), b.data(), Tg, H, D,
                              true, -5.0);
    out.clear();
    for (const auto* v : {&dx, &dw, &ds, &dz, &dA, &db}) out.insert(out.end(), v->begin(), v->end());
  };
  const int keep = num_threads();
  std::vector<double> threaded, serial;
  set_num_threads(std::max(keep, 2));
  run(threaded);
  set_num_threads(1);
  run(serial);
  set_num_threads(keep);
  ASSERT_EQ(threaded.size(), serial.size());
  for (size_t i = 0; i < serial.size(); ++i) ASSERT_EQ(threaded[i], serial[i]) << i;
}
