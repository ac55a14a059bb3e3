// Backward of the whole KDA mixer (model/kda_mixer.h, kda_mixer_backward) against 4-point
// central finite differences in double, on d = 16, H = 2, D = 8, T = 11, conv 4: dx and every
// entry of every weight's gradient, relative error (max |fd - grad| / max |fd|) < 1e-6 per
// tensor; from a zero state (training) and from a carried non-zero KDA and conv state, bounded
// and unbounded gate. Then the float backward (fast chunked core) equals the double one on the
// same inputs (rel RMS < 1e-4), for every forward path, at T = 11 and T = 150 (three chunks);
// saving does not change the forward; grads accumulate; a reused KDASaved is not stale.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "model/kda_mixer.h"

using namespace k3;

namespace {

constexpr int kNumW = 14;
const char* const kNames[kNumW] = {"q_proj", "k_proj", "v_proj", "q_conv", "k_conv", "v_conv", "f_a",
                                   "f_b",    "b_proj", "g_proj", "o_norm", "o_proj", "A_log",  "dt_bias"};

// All weights of one mixer in one scalar type, in kNames order.
template <typename R>
struct Params {
  std::vector<R> t[kNumW];
  KDAWeightsT<R> weights() const {
    return {t[0].data(), t[1].data(), t[2].data(), t[3].data(),  t[4].data(),  t[5].data(),  t[6].data(),
            t[7].data(), t[8].data(), t[9].data(), t[10].data(), t[11].data(), t[12].data(), t[13].data()};
  }
  static KDAGradsT<R> grads(Params& g) {
    auto& t = g.t;
    return {t[0].data(), t[1].data(), t[2].data(), t[3].data(),  t[4].data(),  t[5].data(),  t[6].data(),
            t[7].data(), t[8].data(), t[9].data(), t[10].data(), t[11].data(), t[12].data(), t[13].data()};
  }
};

std::vector<double> randn(int64_t n, std::mt19937& rng, double sd, double mean = 0) {
  std::normal_distribution<double> nd(mean, sd);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& e : v) e = nd(rng);
  return v;
}

Params<double> random_params(const KDADims& m, unsigned seed) {
  std::mt19937 rng(seed);
  const int64_t d = m.d, H = m.H, D = m.D, HD = H * D, K = m.conv_k;
  const double sd = 1 / std::sqrt(double(d));
  Params<double> p;
  p.t[0] = randn(HD * d, rng, sd);
  p.t[1] = randn(HD * d, rng, sd);
  p.t[2] = randn(HD * d, rng, sd);
  p.t[3] = randn(HD * K, rng, 0.5);
  p.t[4] = randn(HD * K, rng, 0.5);
  p.t[5] = randn(HD * K, rng, 0.5);
  p.t[6] = randn(D * d, rng, sd);
  p.t[7] = randn(HD * D, rng, 1 / std::sqrt(double(D)));
  p.t[8] = randn(H * d, rng, sd);
  p.t[9] = randn(HD * d, rng, sd);
  p.t[10] = randn(D, rng, 0.2, 1.0);
  p.t[11] = randn(d * HD, rng, 1 / std::sqrt(double(HD)));
  p.t[12] = randn(H, rng, 0.5);
  p.t[13] = randn(HD, rng, 1.0);
  return p;
}

template <typename R>
Params<R> cast(const Params<double>& p) {
  Params<R> q;
  for (int i = 0; i < kNumW; ++i) q.t[i].assign(p.t[i].begin(), p.t[i].end());
  return q;
}

template <typename R>
Params<R> zeros_like(const Params<double>& p, R fill = 0) {
  Params<R> q;
  for (int i = 0; i < kNumW; ++i) q.t[i].assign(p.t[i].size(), fill);
  return q;
}

KDADims small_dims(bool bounded) { return {16, 2, 8, 4, bounded, -5.0, 1e-6}; }

// A problem: weights, the input, the state the tested call starts from (after a prefill of
// `prefill` tokens, or zero), and the loss weights r (L = sum r * out).
struct Problem {
  KDADims dims;
  int64_t T;
  Params<double> p;
  std::vector<double> x, r;
  KDAStateT<double> st0;
  Problem(const KDADims& dm, int64_t T_, int64_t prefill, unsigned seed) : dims(dm), T(T_), p(random_params(dm, seed)) {
    std::mt19937 rng(seed + 100);
    x = randn(T * dims.d, rng, 1.0);
    r = randn(T * dims.d, rng, 1.0);
    st0.reset(dims);
    if (prefill > 0) {
      auto x0 = randn(prefill * dims.d, rng, 1.0);
      std::vector<double> out(prefill * dims.d);
      KDAScratchT<double> s;
      kda_mixer_forward<double>(out.data(), st0, x0.data(), p.weights(), dims, prefill, KDAPath::Recurrent, s);
    }
  }
  double loss(KDAScratchT<double>& s) const {
    KDAStateT<double> st = st0;
    std::vector<double> out(T * dims.d);
    kda_mixer_forward<double>(out.data(), st, x.data(), p.weights(), dims, T, KDAPath::Recurrent, s);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += r[i] * out[i];
    return l;
  }
};

// Analytic gradients in scalar type R with the given forward path. Grads start at `fill`
// and have it subtracted again, so an assignment instead of += shows.
template <typename R>
void analytic(const Problem& pb, KDAPath path, std::vector<R>& dx, Params<R>& grads, KDASavedT<R>& saved,
              R fill = R(0.25)) {
  const Params<R> p = cast<R>(pb.p);
  KDAStateT<R> st;
  st.S.assign(pb.st0.S.begin(), pb.st0.S.end());
  st.conv_q.assign(pb.st0.conv_q.begin(), pb.st0.conv_q.end());
  st.conv_k.assign(pb.st0.conv_k.begin(), pb.st0.conv_k.end());
  st.conv_v.assign(pb.st0.conv_v.begin(), pb.st0.conv_v.end());
  std::vector<R> x(pb.x.begin(), pb.x.end()), r(pb.r.begin(), pb.r.end()), out(pb.T * pb.dims.d);
  KDAScratchT<R> s;
  kda_mixer_forward<R>(out.data(), st, x.data(), p.weights(), pb.dims, pb.T, path, s, &saved);
  grads = zeros_like<R>(pb.p, fill);
  dx.assign(pb.T * pb.dims.d, std::numeric_limits<R>::quiet_NaN());  // assigned, never read
  kda_mixer_backward<R>(dx.data(), Params<R>::grads(grads), r.data(), saved, p.weights(), pb.dims, pb.T, s);
  for (auto& t : grads.t)
    for (auto& e : t) e -= fill;
}

// Relative error of grad against 4-point central differences of pb.loss in `v` (a vector
// inside pb), every entry.
void check_fd(Problem& pb, std::vector<double>& v, const std::vector<double>& grad, const std::string& what) {
  ASSERT_EQ(v.size(), grad.size()) << what;
  KDAScratchT<double> s;
  const double h = 1e-4;
  double err = 0, scale = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    auto at = [&](double delta) {
      v[i] = keep + delta;
      return pb.loss(s);
    };
    const double fd = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    v[i] = keep;
    ASSERT_TRUE(std::isfinite(grad[i])) << what << " [" << i << "]";
    err = std::max(err, std::fabs(fd - grad[i]));
    scale = std::max(scale, std::fabs(fd));
  }
  ASSERT_GT(scale, 1e-8) << what << ": gradient is all zero, the check would be vacuous";
  EXPECT_LT(err / scale, 1e-6) << what << " max abs err " << err << " scale " << scale;
}

void fd_case(bool bounded, int64_t prefill, unsigned seed) {
  Problem pb(small_dims(bounded), 11, prefill, seed);
  std::vector<double> dx;
  Params<double> g;
  KDASavedT<double> saved;
  analytic<double>(pb, KDAPath::Recurrent, dx, g, saved);
  const std::string tag = std::string(bounded ? "bounded" : "unbounded") + (prefill ? " carried state" : " zero state");
  check_fd(pb, pb.x, dx, tag + " dx");
  for (int i = 0; i < kNumW; ++i) check_fd(pb, pb.p.t[i], g.t[i], tag + " d" + kNames[i]);
}

// Float backward (path `path`) against the double backward (recurrent reference) on the same
// inputs, per tensor relative RMS.
void float_vs_double(int64_t T, int64_t prefill, KDAPath path, bool bounded, unsigned seed) {
  Problem pb(small_dims(bounded), T, prefill, seed);
  std::vector<double> dxd;
  Params<double> gd;
  KDASavedT<double> sd;
  analytic<double>(pb, KDAPath::Recurrent, dxd, gd, sd);
  std::vector<float> dxf;
  Params<float> gf;
  KDASavedT<float> sf;
  analytic<float>(pb, path, dxf, gf, sf);
  const std::string tag = "T=" + std::to_string(T) + " path " + std::to_string(int(path)) +
                          (bounded ? " bounded" : " unbounded");
  auto cmp = [&](const std::vector<float>& a, const std::vector<double>& b, const std::string& what) {
    std::vector<float> bf(b.begin(), b.end());
    ASSERT_EQ(a.size(), bf.size()) << what;
    for (float e : a) ASSERT_TRUE(std::isfinite(e)) << tag << " " << what;
    EXPECT_LT(test::rel_rms(a.data(), bf.data(), int64_t(a.size())), 1e-4) << tag << " " << what;
  };
  cmp(dxf, dxd, "dx");
  for (int i = 0; i < kNumW; ++i) cmp(gf.t[i], gd.t[i], std::string("d") + kNames[i]);
}

}  // namespace

TEST(KDAMixerGrad, DoubleMatchesFiniteDifferencesZeroState) { fd_case(true, 0, 1); }

TEST(KDAMixerGrad, DoubleMatchesFiniteDifferencesCarriedState) { fd_case(true, 5, 2); }

TEST(KDAMixerGrad, DoubleMatchesFiniteDifferencesUnboundedGate) { fd_case(false, 0, 3); }

TEST(KDAMixerGrad, FloatEqualsDoubleT11) {
  for (KDAPath path : {KDAPath::Fast, KDAPath::Chunked, KDAPath::Recurrent}) float_vs_double(11, 0, path, true, 4);
  float_vs_double(11, 3, KDAPath::Fast, true, 5);  // carried state
  float_vs_double(11, 0, KDAPath::Fast, false, 6);  // unbounded gate: Safe diagonal path
}

TEST(KDAMixerGrad, FloatEqualsDoubleT150) {
  float_vs_double(150, 0, KDAPath::Fast, true, 7);
  float_vs_double(150, 0, KDAPath::Chunked, true, 8);
}

// The double backward's core is the recurrent reference whatever the forward path, so every
// double path gives the same gradients; T = 1 (one training token) also works.
TEST(KDAMixerGrad, DoublePathsAgreeAndOneToken) {
  for (int64_t T : {int64_t(1), int64_t(11)}) {
    Problem pb(small_dims(true), T, 2, 9);
    std::vector<double> dxr, dxc;
    Params<double> gr, gc;
    KDASavedT<double> sr, sc;
    analytic<double>(pb, KDAPath::Recurrent, dxr, gr, sr);
    analytic<double>(pb, KDAPath::Chunked, dxc, gc, sc);
    EXPECT_LT(test::rel_rms(dxc.data(), dxr.data(), int64_t(dxr.size())), 1e-12) << "T=" << T;
    for (int i = 0; i < kNumW; ++i)
      EXPECT_LT(test::rel_rms(gc.t[i].data(), gr.t[i].data(), int64_t(gr.t[i].size())), 1e-12)
          << "T=" << T << " d" << kNames[i];
    if (T == 1) {
      check_fd(pb, pb.x, dxr, "T=1 dx");
      check_fd(pb, pb.p.t[12], gr.t[12], "T=1 dA_log");
      float_vs_double(1, 2, KDAPath::Fast, true, 9);
    }
  }
}

// Saving does not change the forward (out and carried state), on every float path and T = 1.
TEST(KDAMixerGrad, SavingDoesNotChangeForward) {
  const KDADims dm = small_dims(true);
  const Params<float> p = cast<float>(random_params(dm, 11));
  std::mt19937 rng(12);
  const int64_t T = 70;
  auto xd = randn(T * dm.d, rng, 1.0);
  std::vector<float> x(xd.begin(), xd.end());
  for (KDAPath path : {KDAPath::Recurrent, KDAPath::Chunked, KDAPath::Fast}) {
    for (int64_t n : {T, int64_t(1)}) {
      KDAState a, b;
      a.reset(dm);
      b.reset(dm);
      KDAScratch s;
      KDASaved saved;
      std::vector<float> oa(n * dm.d), ob(n * dm.d);
      kda_mixer_forward(oa.data(), a, x.data(), p.weights(), dm, n, path, s);
      kda_mixer_forward(ob.data(), b, x.data(), p.weights(), dm, n, path, s, &saved);
      const std::string tag = "path " + std::to_string(int(path)) + " T=" + std::to_string(n);
      test::expect_close(ob.data(), oa.data(), n * dm.d, 1e-6, 1e-5, tag + " out");
      test::expect_close(b.S.data(), a.S.data(), int64_t(a.S.size()), 1e-6, 1e-5, tag + " S");
      test::expect_close(b.conv_v.data(), a.conv_v.data(), int64_t(a.conv_v.size()), 0, 0, tag + " conv_v");
      EXPECT_EQ(saved.T, n);
      test::expect_close(saved.x.data(), x.data(), n * dm.d, 0, 0, tag + " saved x");
    }
  }
}

// One KDASaved reused: a Fast forward on one input, then a Chunked forward on another; the
// backward must not use the first call's per-chunk states. Also a second backward from the
// same saved gives the same gradients.
TEST(KDAMixerGrad, ReusedSavedIsNotStale) {
  Problem a(small_dims(true), 40, 0, 13), b(small_dims(true), 40, 0, 14);
  b.p = a.p;  // same weights, different input
  std::vector<float> dx_fresh, dx_reused;
  Params<float> g_fresh, g_reused;
  KDASaved fresh, reused;
  analytic<float>(b, KDAPath::Chunked, dx_fresh, g_fresh, fresh);
  analytic<float>(a, KDAPath::Fast, dx_reused, g_reused, reused);
  analytic<float>(b, KDAPath::Chunked, dx_reused, g_reused, reused);
  EXPECT_LT(test::rel_rms(dx_reused.data(), dx_fresh.data(), int64_t(dx_fresh.size())), 1e-6);
  for (int i = 0; i < kNumW; ++i)
    EXPECT_LT(test::rel_rms(g_reused.t[i].data(), g_fresh.t[i].data(), int64_t(g_fresh.t[i].size())), 1e-6)
        << kNames[i];
  // Second backward from the same saved (its workspace now holds the backward's state pass).
  const Params<float> p = cast<float>(b.p);
  std::vector<float> r(b.r.begin(), b.r.end()), dx2(dx_fresh.size());
  Params<float> g2 = zeros_like<float>(b.p);
  KDAScratch s;
  kda_mixer_backward(dx2.data(), Params<float>::grads(g2), r.data(), fresh, p.weights(), b.dims, b.T, s);
  EXPECT_LT(test::rel_rms(dx2.data(), dx_fresh.data(), int64_t(dx2.size())), 1e-6);
}
