// KDA core (kernels/kda.h): the recurrence against ops/kda_recur1.json and kda_recur8.json,
// then the chain of trust: decode step == recurrence, chunked == recurrence (double, tight;
// float) over lengths around the chunk size, zero and non-zero initial state, bounded gates
// with some pinned at the floor -5 (and at 0), and an unbounded-gate case.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "common/fixture.h"
#include "kernels/activations.h"
#include "kernels/kda.h"
#include "kernels/kda_gate.h"

using namespace k3;

namespace {

struct Inputs {
  int64_t T, H, Dk, Dv;
  std::vector<double> q, k, v, g, beta, s0;
};

// q, k unit-norm per head (as the mixer feeds them), v ~ N(0,1), beta = sigmoid(N(0,1)),
// g from the bounded gate (lb -5) on random z, then head 0 channels 0..3 pinned at the
// floor -5 and channel 4 at 0 (alpha = 1); `unbounded` uses the Kimi Linear gate instead.
Inputs make_inputs(int64_t T, int64_t H, int64_t Dk, int64_t Dv, bool random_state, bool unbounded, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0, 1);
  Inputs in{T, H, Dk, Dv, {}, {}, {}, {}, {}, {}};
  in.q.resize(T * H * Dk);
  in.k.resize(T * H * Dk);
  in.v.resize(T * H * Dv);
  in.g.resize(T * H * Dk);
  in.beta.resize(T * H);
  in.s0.assign(H * Dk * Dv, 0.0);
  for (auto* x : {&in.q, &in.k})
    for (int64_t r = 0; r < T * H; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < Dk; ++c) ss += ((*x)[r * Dk + c] = n(rng)) * (*x)[r * Dk + c];
      for (int64_t c = 0; c < Dk; ++c) (*x)[r * Dk + c] /= std::sqrt(ss);
    }
  for (auto& e : in.v) e = n(rng);
  for (auto& e : in.beta) e = sigmoid(n(rng));
  std::vector<double> z(T * H * Dk), A_log(H), dt(H * Dk);
  for (auto& e : z) e = 1.5 * n(rng);
  for (auto& e : A_log) e = 0.5 * n(rng);
  for (auto& e : dt) e = 0.5 * n(rng);
  kda_gate_forward<double>(in.g.data(), z.data(), A_log.data(), dt.data(), T, H, Dk, !unbounded, -5.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < 4 && c < Dk; ++c) in.g[t * H * Dk + c] = -5.0;
    if (Dk > 4) in.g[t * H * Dk + 4] = 0.0;
  }
  if (random_state)
    for (auto& e : in.s0) e = 0.5 * n(rng);
  return in;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

struct Result {
  std::vector<double> o, s;
};

template <typename T>
Result run(const Inputs& in, bool chunked, int64_t chunk, double scale) {
  auto q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v), g = cast<T>(in.g), b = cast<T>(in.beta);
  auto s = cast<T>(in.s0);
  std::vector<T> o(in.T * in.H * in.Dv, T(777));  // poison: every output must be written
  if (chunked)
    kda_chunk_forward<T>(o.data(), s.data(), q.data(), k.data(), v.data(), g.data(), b.data(), in.T, in.H, in.Dk,
                         in.Dv, scale, chunk);
  else
    kda_recurrent_forward<T>(o.data(), s.data(), q.data(), k.data(), v.data(), g.data(), b.data(), in.T, in.H,
                             in.Dk, in.Dv, scale);
  return {std::vector<double>(o.begin(), o.end()), std::vector<double>(s.begin(), s.end())};
}

// |a - e| <= abs_tol + rel_tol * |e| everywhere, finite first.
void expect_close_d(const std::vector<double>& a, const std::vector<double>& e, double abs_tol, double rel_tol,
                    const std::string& what) {
  ASSERT_EQ(a.size(), e.size()) << what;
  int64_t nbad = 0, worst = -1;
  double wv = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << what << " index " << i;
    const double err = std::fabs(a[i] - e[i]), lim = abs_tol + rel_tol * std::fabs(e[i]);
    if (err > lim) {
      ++nbad;
      if (err - lim > wv) wv = err - lim, worst = int64_t(i);
    }
  }
  if (nbad) ADD_FAILURE() << what << ": " << nbad << " values out of tolerance; worst index " << worst << " got "
                          << a[worst] << " expected " << e[worst];
}

}  // namespace

// The fixtures give alpha = exp(g) and raw (not normalised) q, k; q_scale multiplies q.
template <typename T>
void check_recur_fixture(const std::string& file, bool decode) {
  test::Fixture fx(file);
  auto q = fx.tensor("q"), k = fx.tensor("k"), v = fx.tensor("v"), al = fx.tensor("alpha"), be = fx.tensor("beta");
  auto eo = fx.tensor("out"), es = fx.tensor("state_out");
  const int64_t Tn = int64_t(fx.num("T")), H = int64_t(fx.num("H")), Dk = int64_t(fx.num("d_k")),
                Dv = int64_t(fx.num("d_v"));
  ASSERT_EQ(q.numel(), Tn * H * Dk);
  ASSERT_EQ(es.numel(), H * Dk * Dv);
  std::vector<float> g(al.numel());
  for (int64_t i = 0; i < al.numel(); ++i) g[i] = std::log(al.data[i]);
  std::vector<float> o(Tn * H * Dv), s(H * Dk * Dv, 0.0f);
  if (decode) {
    for (int64_t t = 0; t < Tn; ++t)
      kda_decode_step(o.data() + t * H * Dv, s.data(), q.data.data() + t * H * Dk, k.data.data() + t * H * Dk,
                      v.data.data() + t * H * Dv, g.data() + t * H * Dk, be.data.data() + t * H, H, Dk, Dv,
                      fx.num("q_scale"));
  } else {
    auto qq = cast<T>(std::vector<double>(q.data.begin(), q.data.end()));
    auto kk = cast<T>(std::vector<double>(k.data.begin(), k.data.end()));
    auto vv = cast<T>(std::vector<double>(v.data.begin(), v.data.end()));
    auto gg = cast<T>(std::vector<double>(g.begin(), g.end()));
    auto bb = cast<T>(std::vector<double>(be.data.begin(), be.data.end()));
    std::vector<T> oo(o.size()), ss(s.size(), T(0));
    kda_recurrent_forward<T>(oo.data(), ss.data(), qq.data(), kk.data(), vv.data(), gg.data(), bb.data(), Tn, H,
                             Dk, Dv, fx.num("q_scale"));
    for (size_t i = 0; i < o.size(); ++i) o[i] = float(oo[i]);
    for (size_t i = 0; i < s.size(); ++i) s[i] = float(ss[i]);
  }
  test::expect_close(o, eo, 1e-5, 1e-4, file + " out");
  test::expect_close(s, es, 1e-5, 1e-4, file + " state_out");
}

TEST(KDARecurrent, MatchesFixtureOneToken) {
  check_recur_fixture<float>("ops/kda_recur1.json", false);
  check_recur_fixture<double>("ops/kda_recur1.json", false);
}
TEST(KDARecurrent, MatchesFixtureEightTokens) {
  check_recur_fixture<float>("ops/kda_recur8.json", false);
  check_recur_fixture<double>("ops/kda_recur8.json", false);
}
TEST(KDADecodeStep, MatchesFixtures) {
  check_recur_fixture<float>("ops/kda_recur1.json", true);
  check_recur_fixture<float>("ops/kda_recur8.json", true);
}

TEST(KDADecodeStep, EqualsRecurrentWithCarriedState) {
  const int64_t T = 40, H = 3, Dk = 16, Dv = 12;
  Inputs in = make_inputs(T, H, Dk, Dv, true, false, 11);
  const double scale = 1 / std::sqrt(double(Dk));
  Result ref = run<float>(in, false, 0, scale);
  auto q = cast<float>(in.q), k = cast<float>(in.k), v = cast<float>(in.v), g = cast<float>(in.g),
       b = cast<float>(in.beta), s = cast<float>(in.s0);
  std::vector<float> o(T * H * Dv);
  for (int64_t t = 0; t < T; ++t)
    kda_decode_step(o.data() + t * H * Dv, s.data(), q.data() + t * H * Dk, k.data() + t * H * Dk,
                    v.data() + t * H * Dv, g.data() + t * H * Dk, b.data() + t * H, H, Dk, Dv, scale);
  expect_close_d(std::vector<double>(o.begin(), o.end()), ref.o, 1e-5, 1e-5, "decode out");
  expect_close_d(std::vector<double>(s.begin(), s.end()), ref.s, 1e-5, 1e-5, "decode state");
}

// Chunked == recurrent over the grid of the brief: T x chunk x {zero, random} initial state.
TEST(KDAChunk, EqualsRecurrentDoubleAndFloat) {
  const int64_t H = 2, Dk = 16, Dv = 12;
  const double scale = 1 / std::sqrt(double(Dk));
  unsigned seed = 100;
  for (int64_t T : {1, 5, 63, 64, 65, 128, 200})
    for (int64_t chunk : {16, 64})
      for (bool rs : {false, true}) {
        const std::string tag = "T=" + std::to_string(T) + " chunk=" + std::to_string(chunk) +
                                (rs ? " random state" : " zero state");
        Inputs in = make_inputs(T, H, Dk, Dv, rs, false, ++seed);
        Result rd = run<double>(in, false, 0, scale), cd = run<double>(in, true, chunk, scale);
        expect_close_d(cd.o, rd.o, 1e-12, 1e-10, tag + " double out");
        expect_close_d(cd.s, rd.s, 1e-12, 1e-10, tag + " double state");
        Result cf = run<float>(in, true, chunk, scale);
        expect_close_d(cf.o, rd.o, 1e-5, 1e-5, tag + " float out");
        expect_close_d(cf.s, rd.s, 1e-5, 1e-5, tag + " float state");
      }
}

// The plain chunked form forms only e^(gamma_i - gamma_j), i >= j, so unbounded gates
// (g down to about -60 here) are as safe as bounded ones.
TEST(KDAChunk, EqualsRecurrentUnboundedGate) {
  const int64_t T = 130, H = 2, Dk = 16, Dv = 16;
  Inputs in = make_inputs(T, H, Dk, Dv, true, true, 7);
  Result rd = run<double>(in, false, 0, 0.25), cd = run<double>(in, true, 64, 0.25);
  expect_close_d(cd.o, rd.o, 1e-12, 1e-10, "unbounded out");
  expect_close_d(cd.s, rd.s, 1e-12, 1e-10, "unbounded state");
  Result cf = run<float>(in, true, 64, 0.25);
  expect_close_d(cf.o, rd.o, 1e-5, 1e-5, "unbounded float out");
}

// Splitting a sequence across calls (state carried) equals one call, for both forms.
TEST(KDAChunk, StateCarriesAcrossCalls) {
  const int64_t T = 100, H = 2, Dk = 8, Dv = 8, split = 37;
  Inputs in = make_inputs(T, H, Dk, Dv, true, false, 21);
  Result whole = run<double>(in, true, 16, 0.5);
  Inputs a = in, b = in;
  a.T = split;
  b.T = T - split;
  auto slice = [](std::vector<double>& x, int64_t from, int64_t to, int64_t w) {
    x = std::vector<double>(x.begin() + from * w, x.begin() + to * w);
  };
  for (auto* p : {&a.q, &a.k, &a.g}) slice(*p, 0, split, H * Dk);
  for (auto* p : {&b.q, &b.k, &b.g}) slice(*p, split, T, H * Dk);
  slice(a.v, 0, split, H * Dv);
  slice(b.v, split, T, H * Dv);
  slice(a.beta, 0, split, H);
  slice(b.beta, split, T, H);
  Result ra = run<double>(a, true, 16, 0.5);
  b.s0 = ra.s;
  Result rb = run<double>(b, false, 0, 0.5);
  std::vector<double> o = ra.o;
  o.insert(o.end(), rb.o.begin(), rb.o.end());
  expect_close_d(o, whole.o, 1e-12, 1e-10, "split out");
  expect_close_d(rb.s, whole.s, 1e-12, 1e-10, "split state");
}
