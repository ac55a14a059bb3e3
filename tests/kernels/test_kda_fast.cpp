// Fast chunked KDA forward (kernels/kda_fast.h) and its tile products (kernels/matmul_bf16.h):
//   tile products and packing == their plain references;
//   chain of trust: double recurrence -> double plain chunked -> fast kernel (f32 and bf16,
//   Dense and Safe diagonal paths), lengths around and not multiple of the chunk, with and
//   without initial state, ragged head dims; fixture ops/kda_recur8.json;
//   the decode step == the recurrence;
//   the numerical claim of docs/model.md section 3 (docs/kda-numerics.md): gates pinned at the
//   floor -5 keep every anchored exponent within 40 and the bf16 dense kernel tracks the
//   double recurrence; unbounded strong decay overflows the dense path (inf/NaN) while the
//   safe path stays finite and correct.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "core/dtype.h"
#include "kernels/kda.h"
#include "kernels/kda_fast.h"
#include "kernels/kda_gate.h"
#include "kernels/matmul_bf16.h"

using namespace k3;
using k3::test::rel_rms;

namespace {

// ---------------------------------------------------------------------------------------
// inputs

struct FastInputs {
  int64_t T, H, Dk, Dv;
  std::vector<double> q, k, v, g, beta, s0;
};

enum class Gate { Bounded, FloorPinned, Unbounded, UnboundedStrong };

// q, k unit-norm per head, v ~ N(0,1), beta = sigmoid(N(0,1)); g from the K3 gate (floor -5)
// or the Kimi Linear gate; FloorPinned additionally pins half the channels of every token at
// -5 (the adversarial case of the claim); UnboundedStrong gives every token a decay of about
// -30 on a quarter of the channels.
FastInputs make_inputs(int64_t T, int64_t H, int64_t Dk, int64_t Dv, bool random_state, Gate gate, unsigned seed,
                   bool round_bf16 = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0, 1);
  FastInputs in{T, H, Dk, Dv, {}, {}, {}, {}, {}, {}};
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
  for (auto& e : in.beta) e = 1 / (1 + std::exp(-n(rng)));
  std::vector<double> z(T * H * Dk), A_log(H), dt(H * Dk);
  for (auto& e : z) e = 1.5 * n(rng);
  for (auto& e : A_log) e = 0.5 * n(rng);
  for (auto& e : dt) e = 0.5 * n(rng);
  const bool bounded = gate == Gate::Bounded || gate == Gate::FloorPinned;
  kda_gate_forward<double>(in.g.data(), z.data(), A_log.data(), dt.data(), T, H, Dk, bounded, -5.0);
  if (gate == Gate::FloorPinned)
    for (int64_t r = 0; r < T * H; ++r)
      for (int64_t c = 0; c < Dk; c += 2) in.g[r * Dk + c] = -5.0;
  if (gate == Gate::UnboundedStrong)
    for (int64_t r = 0; r < T * H; ++r)
      for (int64_t c = 0; c < Dk; c += 4) in.g[r * Dk + c] = -30.0 + n(rng);
  if (random_state)
    for (auto& e : in.s0) e = 0.5 * n(rng);
  if (round_bf16)  // the bf16 experiment's inputs are bf16 values
    for (auto* x : {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.s0})
      for (auto& e : *x) e = bf16_to_f32(f32_to_bf16(float(e)));
  return in;
}

std::vector<float> to_f(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

struct Out {
  std::vector<double> o, s;
};

Out run_recurrent(const FastInputs& in, double scale) {
  Out r{std::vector<double>(in.T * in.H * in.Dv), in.s0};
  kda_recurrent_forward<double>(r.o.data(), r.s.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                in.beta.data(), in.T, in.H, in.Dk, in.Dv, scale);
  return r;
}

Out run_chunk_ref(const FastInputs& in, double scale, int64_t chunk) {
  Out r{std::vector<double>(in.T * in.H * in.Dv), in.s0};
  kda_chunk_forward<double>(r.o.data(), r.s.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                            in.beta.data(), in.T, in.H, in.Dk, in.Dv, scale, chunk);
  return r;
}

struct OutF {
  std::vector<float> o, s;
};

OutF run_fast(const FastInputs& in, double scale, const KDAFastOptions& opt, KDAWorkspace& ws) {
  auto q = to_f(in.q), k = to_f(in.k), v = to_f(in.v), g = to_f(in.g), b = to_f(in.beta);
  OutF r{std::vector<float>(in.T * in.H * in.Dv, 777.f), to_f(in.s0)};  // poison: every output is written
  kda_chunk_fast_forward(r.o.data(), r.s.data(), q.data(), k.data(), v.data(), g.data(), b.data(), in.T, in.H, in.Dk,
                         in.Dv, scale, opt, ws);
  return r;
}

double rel(const std::vector<float>& a, const std::vector<double>& b) {
  std::vector<double> ad(a.begin(), a.end());
  return rel_rms(ad.data(), b.data(), int64_t(b.size()));
}
bool all_finite(const std::vector<float>& x) {
  for (float e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

KDAFastOptions opts(bool bf16, KDAFastOptions::DiagPath diag, int64_t chunk = 64) {
  KDAFastOptions o;
  o.bf16 = bf16;
  o.diag = diag;
  o.chunk = chunk;
  return o;
}
constexpr auto kDense = KDAFastOptions::DiagPath::Dense;
constexpr auto kSafe = KDAFastOptions::DiagPath::Safe;

}  // namespace

// ---------------------------------------------------------------------------------------
// tile products

TEST(KdaTileProducts, F32MatchesReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0, 1);
  struct Case {
    int64_t M, N, K;
    bool at;
    Tri tri;
    bool cs, acc;
  };
  const Case cases[] = {{128, 128, 128, false, Tri::None, false, false}, {64, 128, 64, false, Tri::Lower, false, true},
                        {128, 128, 64, true, Tri::None, false, true},    {37, 48, 21, false, Tri::None, true, false},
                        {64, 64, 64, true, Tri::Upper, false, false},    {13, 16, 13, true, Tri::Lower, true, true},
                        {32, 16, 128, false, Tri::None, true, false}};
  for (const auto& c : cases) {
    std::vector<float> A(c.M * c.K), B(c.K * c.N), cs(c.N), C0(c.M * c.N);
    for (auto& e : A) e = n(rng);
    for (auto& e : B) e = n(rng);
    for (auto& e : cs) e = n(rng);
    for (auto& e : C0) e = n(rng);
    const int64_t lda = c.at ? c.M : c.K;
    // the triangle the kernel may skip holds zeros
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t k = 0; k < c.K; ++k) {
        float& a = c.at ? A[k * lda + i] : A[i * lda + k];
        if ((c.tri == Tri::Lower && k > i) || (c.tri == Tri::Upper && k < i)) a = 0;
      }
    auto C1 = C0, C2 = C0;
    mm_f32(C1.data(), c.N, A.data(), lda, c.at, B.data(), c.N, c.M, c.N, c.K, -0.5f, c.acc, c.tri,
           c.cs ? cs.data() : nullptr);
    mm_f32_ref(C2.data(), c.N, A.data(), lda, c.at, B.data(), c.N, c.M, c.N, c.K, -0.5f, c.acc, c.tri,
               c.cs ? cs.data() : nullptr);
    EXPECT_LT(rel_rms(C1.data(), C2.data(), c.M * c.N), 1e-6) << c.M << "x" << c.N << "x" << c.K;
  }
}

TEST(KdaTileProducts, Bf16MatchesReference) {
  std::mt19937 rng(8);
  std::normal_distribution<float> n(0, 1);
  for (auto [M, N, K, tri] : {std::tuple<int64_t, int64_t, int64_t, Tri>{128, 128, 128, Tri::None},
                              {64, 128, 64, Tri::Lower}, {64, 64, 64, Tri::Upper}, {21, 48, 34, Tri::None},
                              {32, 16, 128, Tri::None}, {9, 32, 16, Tri::Lower}}) {
    std::vector<float> A(M * K), B(K * N), cs(N), C0(M * N);
    for (auto& e : A) e = n(rng);
    for (auto& e : B) e = n(rng);
    for (auto& e : cs) e = n(rng);
    for (auto& e : C0) e = n(rng);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k)
        if ((tri == Tri::Lower && k > i) || (tri == Tri::Upper && k < i)) A[i * K + k] = 0;
    std::vector<uint16_t> Ah(M * K), Bp((K + 1) / 2 * 2 * N);
    to_bf16(Ah.data(), K, A.data(), K, M, K);
    pack_vnni(Bp.data(), N, B.data(), N, K, N);
    auto C1 = C0, C2 = C0;
    mm_bf16(C1.data(), N, Ah.data(), K, Bp.data(), N, M, N, K, 2.f, true, tri, cs.data());
    mm_bf16_ref(C2.data(), N, Ah.data(), K, Bp.data(), N, M, N, K, 2.f, true, tri, cs.data());
    EXPECT_LT(rel_rms(C1.data(), C2.data(), M * N), 1e-6) << M << "x" << N << "x" << K;
    // and bf16 products of bf16-rounded operands are close to the f32 product
    std::vector<float> C3(M * N);
    mm_f32_ref(C3.data(), N, A.data(), K, false, B.data(), N, M, N, K, 1.f, false, tri);
    std::vector<float> C4(M * N);
    mm_bf16(C4.data(), N, Ah.data(), K, Bp.data(), N, M, N, K, 1.f, false, tri);
    EXPECT_LT(rel_rms(C4.data(), C3.data(), M * N), 1e-2);
  }
}

TEST(KdaTileProducts, PackingMatchesReference) {
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0, 1);
  for (auto [R, Cc] : {std::pair<int64_t, int64_t>{64, 128}, {128, 64}, {40, 24}, {33, 17}, {16, 16}, {32, 48}, {48, 80}}) {
    std::vector<float> src(R * Cc), sc(Cc);
    for (auto& e : src) e = n(rng);
    for (auto& e : sc) e = n(rng);
    std::vector<float> t1(R * Cc), t2(R * Cc);
    transpose_f32(t1.data(), R, src.data(), Cc, R, Cc, sc.data());
    transpose_f32_ref(t2.data(), R, src.data(), Cc, R, Cc, sc.data());
    EXPECT_EQ(t1, t2) << "transpose_f32 " << R << "x" << Cc;
    const int64_t Re = R + R % 2;  // even leading dimension for the word view
    std::vector<uint16_t> h1(Re * Cc, 1), h2(Re * Cc, 1);
    to_bf16_t(h1.data(), Re, src.data(), Cc, R, Cc);
    to_bf16_t_ref(h2.data(), Re, src.data(), Cc, R, Cc);
    EXPECT_EQ(h1, h2) << "to_bf16_t " << R << "x" << Cc;
    // pack_vnni_t: B(k, n) = src[n*Cc + k], K = Cc, N = R
    std::vector<uint16_t> p1((Cc + 1) / 2 * 2 * R, 1), p2((Cc + 1) / 2 * 2 * R, 1);
    pack_vnni_t(p1.data(), R, src.data(), Cc, Cc, R, sc.data());
    pack_vnni_t_ref(p2.data(), R, src.data(), Cc, Cc, R, sc.data());
    EXPECT_EQ(p1, p2) << "pack_vnni_t " << R << "x" << Cc;
  }
}

// ---------------------------------------------------------------------------------------
// forward chain of trust

TEST(KdaFastForward, ChainRecurrentChunkedFast) {
  const double tol_f32 = 2e-6;
  KDAWorkspace ws;  // reused across shapes on purpose
  struct Case {
    int64_t T, H, Dk, Dv, chunk;
    bool state;
  };
  for (const Case& c : {Case{1, 2, 16, 16, 64, true}, Case{17, 3, 16, 32, 16, false}, Case{64, 2, 32, 16, 64, true},
                        Case{100, 2, 40, 24, 64, true}, Case{200, 2, 128, 128, 64, false},
                        Case{150, 1, 24, 40, 32, true}}) {
    const FastInputs in = make_inputs(c.T, c.H, c.Dk, c.Dv, c.state, Gate::Bounded, unsigned(c.T * 7 + c.Dk));
    const double scale = 1 / std::sqrt(double(c.Dk));
    const Out rec = run_recurrent(in, scale);
    const Out chk = run_chunk_ref(in, scale, c.chunk);
    const std::string what = "T=" + std::to_string(c.T) + " Dk=" + std::to_string(c.Dk) + " Dv=" +
                             std::to_string(c.Dv) + " chunk=" + std::to_string(c.chunk);
    ASSERT_LT(rel_rms(chk.o.data(), rec.o.data(), int64_t(rec.o.size())), 1e-12) << what;
    ASSERT_LT(rel_rms(chk.s.data(), rec.s.data(), int64_t(rec.s.size())), 1e-12) << what;
    for (auto diag : {kDense, kSafe}) {
      const OutF f = run_fast(in, scale, opts(false, diag, c.chunk), ws);
      ASSERT_TRUE(all_finite(f.o)) << what;
      EXPECT_LT(rel(f.o, chk.o), tol_f32) << what << (diag == kDense ? " dense" : " safe");
      EXPECT_LT(rel(f.s, chk.s), tol_f32) << what << (diag == kDense ? " dense" : " safe");
      const OutF b = run_fast(in, scale, opts(true, diag, c.chunk), ws);
      EXPECT_LT(rel(b.o, chk.o), 1.5e-2) << what << " bf16";
      EXPECT_LT(rel(b.s, chk.s), 1.5e-2) << what << " bf16";
    }
  }
}

TEST(KdaFastForward, Bf16OnBf16InputsTracksDoubleRecurrence) {
  // bf16 values in, f32 state: the error is the products' operand rounding only.
  const FastInputs in = make_inputs(300, 2, 128, 128, true, Gate::Bounded, 11, /*round_bf16=*/true);
  const double scale = 1 / std::sqrt(128.0);
  const Out rec = run_recurrent(in, scale);
  KDAWorkspace ws;
  for (auto diag : {kDense, kSafe}) {
    const OutF b = run_fast(in, scale, opts(true, diag), ws);
    EXPECT_LT(rel(b.o, rec.o), 1e-2);
    EXPECT_LT(rel(b.s, rec.s), 1e-2);
  }
}

TEST(KdaFastForward, AutoPathFollowsGateBound) {
  KDAFastOptions o;
  EXPECT_EQ(kda_fast_diag_path(o), kDense);
  o.gate_bounded = false;
  EXPECT_EQ(kda_fast_diag_path(o), kSafe);
  o.diag = kDense;
  EXPECT_EQ(kda_fast_diag_path(o), kDense);
  // Auto with an unbounded gate takes the safe path and stays finite where Dense overflows.
  const FastInputs in = make_inputs(96, 1, 32, 32, false, Gate::UnboundedStrong, 5);
  KDAWorkspace ws;
  KDAFastOptions a;
  a.gate_bounded = false;
  EXPECT_TRUE(all_finite(run_fast(in, 0.2, a, ws).o));
}

TEST(KdaFastForward, FixtureRecur8) {
  test::Fixture fx("ops/kda_recur8.json");
  const int64_t T = int64_t(fx.num("T")), H = int64_t(fx.num("H")), Dk = int64_t(fx.num("d_k")),
                Dv = int64_t(fx.num("d_v"));
  auto q = fx.tensor("q").data, k = fx.tensor("k").data, v = fx.tensor("v").data,
       alpha = fx.tensor("alpha").data, beta = fx.tensor("beta").data;
  std::vector<float> g(alpha.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::log(alpha[i]);
  for (bool bf : {false, true})
    for (auto diag : {kDense, kSafe}) {
      std::vector<float> o(T * H * Dv), s(H * Dk * Dv, 0.f);
      KDAWorkspace ws;
      kda_chunk_fast_forward(o.data(), s.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), T, H, Dk, Dv,
                             fx.num("q_scale"), opts(bf, diag), ws);
      if (!bf) {
        test::expect_close(o, fx.tensor("out"), 1e-5, 1e-4, "out");
        test::expect_close(s, fx.tensor("state_out"), 1e-5, 1e-4, "state_out");
      } else {
        EXPECT_LT(rel_rms(o.data(), fx.tensor("out").data.data(), T * H * Dv), 1e-2);
      }
    }
}

// ---------------------------------------------------------------------------------------
// decode step

TEST(KdaFastDecode, StepsMatchRecurrence) {
  for (auto [Dk, Dv] : {std::pair<int64_t, int64_t>{128, 128}, {24, 40}, {16, 200}}) {
    const int64_t T = 12, H = 3;
    const FastInputs in = make_inputs(T, H, Dk, Dv, true, Gate::Bounded, unsigned(Dk + Dv));
    const double scale = 1 / std::sqrt(double(Dk));
    const Out rec = run_recurrent(in, scale);
    auto q = to_f(in.q), k = to_f(in.k), v = to_f(in.v), g = to_f(in.g), b = to_f(in.beta), s = to_f(in.s0);
    std::vector<float> o(T * H * Dv);
    for (int64_t t = 0; t < T; ++t)
      kda_decode_step_fast(o.data() + t * H * Dv, s.data(), q.data() + t * H * Dk, k.data() + t * H * Dk,
                           v.data() + t * H * Dv, g.data() + t * H * Dk, b.data() + t * H, H, Dk, Dv, scale);
    EXPECT_LT(rel(o, rec.o), 1e-6) << Dk << "x" << Dv;
    EXPECT_LT(rel(s, rec.s), 1e-6) << Dk << "x" << Dv;
  }
}

// ---------------------------------------------------------------------------------------
// the numerical claim (docs/model.md section 3; docs/kda-numerics.md has the T = 65536 run)

namespace {
// Largest |G_i - G_anchor| over the dense path's tiles: the exponent range the claim bounds.
double max_anchor_exponent(const FastInputs& in, int64_t chunk) {
  double worst = 0;
  const int64_t ld = in.H * in.Dk;
  for (int64_t h = 0; h < in.H; ++h)
    for (int64_t c0 = 0; c0 < in.T; c0 += chunk)
      for (int64_t b0 = c0; b0 < std::min(in.T, c0 + chunk); b0 += 16)
        for (int64_t d = 0; d < in.Dk; ++d) {
          // G relative to the tile's middle row b0 + 8: sums of g between the row and the anchor
          const int64_t m = b0 + 8;
          for (int64_t i = b0; i < std::min(in.T, b0 + 16); ++i) {
            double e = 0;
            for (int64_t t = std::min(i, m) + 1; t <= std::max(i, m) && t < in.T; ++t) e += in.g[t * ld + h * in.Dk + d];
            worst = std::max(worst, std::abs(e));
          }
        }
  return worst;
}
}  // namespace

TEST(KdaFastNumerics, FloorPinnedGatesStayInRangeAndBf16DenseTracksDouble) {
  const FastInputs in = make_inputs(4096, 1, 128, 128, true, Gate::FloorPinned, 21, /*round_bf16=*/true);
  EXPECT_LE(max_anchor_exponent(in, 64), 40.0 + 1e-9);  // 8 steps of at most 5 each way
  const double scale = 1 / std::sqrt(128.0);
  const Out rec = run_recurrent(in, scale);
  KDAWorkspace ws;
  const OutF b = run_fast(in, scale, opts(true, kDense), ws);
  ASSERT_TRUE(all_finite(b.o));
  ASSERT_TRUE(all_finite(b.s));
  EXPECT_LT(rel(b.o, rec.o), 1e-2);
  EXPECT_LT(rel(b.s, rec.s), 1e-2);
  const OutF f = run_fast(in, scale, opts(false, kDense), ws);
  EXPECT_LT(rel(f.o, rec.o), 1e-5);
}

TEST(KdaFastNumerics, UnboundedStrongDecayOverflowsDenseButNotSafe) {
  const FastInputs in = make_inputs(256, 2, 64, 64, true, Gate::UnboundedStrong, 31);
  EXPECT_GT(max_anchor_exponent(in, 64), 88.7);  // beyond e^88.7 = FLT_MAX: the dense anchors overflow
  const double scale = 1 / std::sqrt(64.0);
  const Out rec = run_recurrent(in, scale);
  KDAWorkspace ws;
  for (bool bf : {false, true}) {
    const OutF dense = run_fast(in, scale, opts(bf, kDense), ws);
    EXPECT_FALSE(all_finite(dense.o)) << "dense path was expected to overflow (bf16=" << bf << ")";
    const OutF safe = run_fast(in, scale, opts(bf, kSafe), ws);
    ASSERT_TRUE(all_finite(safe.o));
    ASSERT_TRUE(all_finite(safe.s));
    EXPECT_LT(rel(safe.o, rec.o), bf ? 1.5e-2 : 2e-6);
    EXPECT_LT(rel(safe.s, rec.s), bf ? 1.5e-2 : 2e-6);
  }
}
