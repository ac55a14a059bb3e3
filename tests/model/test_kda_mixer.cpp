// The whole KDA mixer (model/kda_mixer.h) against ops/kda_layer1.json and kda_layer8.json on
// both paths (no initial state in these fixtures: they start from zero state and conv state);
// then carried state: prefill + one-token decodes == one forward, and chunked == recurrent
// at T = 150, with a non-trivial o_norm (the fixtures' is all ones).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "common/fixture.h"
#include "model/kda_mixer.h"

using namespace k3;

namespace {

struct LayerFix {
  test::Fixture fx;
  std::vector<test::FixTensor> t;  // weights, kept alive for the pointers in w
  KDAWeights w{};
  KDADims dims{};

  explicit LayerFix(const std::string& file) : fx(file) {
    const char* names[] = {"q_proj", "k_proj", "v_proj", "q_conv", "k_conv", "v_conv", "f_a",
                           "f_b",    "b_proj", "g_proj", "o_norm", "o_proj", "A_log",  "dt_bias"};
    for (const char* n : names) t.push_back(fx.tensor(n));
    auto p = [&](size_t i) { return t[i].data.data(); };
    w.q_proj = p(0), w.k_proj = p(1), w.v_proj = p(2), w.q_conv = p(3), w.k_conv = p(4), w.v_conv = p(5);
    w.f_a = p(6), w.f_b = p(7), w.b_proj = p(8), w.g_proj = p(9), w.o_norm = p(10), w.o_proj = p(11);
    w.A_log = p(12), w.dt_bias = p(13);
    const int64_t H = int64_t(fx.num("H")), D = int64_t(fx.num("d_k"));
    dims = {t[0].shape[1], H, D, int64_t(fx.num("conv_k")), true, fx.num("lower_bound"), fx.num("rms_eps")};
    // Shapes as the header documents them.
    const int64_t HD = H * D, d = dims.d, K = dims.conv_k;
    const std::vector<std::vector<int64_t>> want = {{HD, d}, {HD, d}, {HD, d}, {HD, 1, K}, {HD, 1, K},
                                                    {HD, 1, K}, {D, d}, {HD, D}, {H, d}, {HD, d},
                                                    {D},     {d, HD}, {H},    {HD}};
    for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i].shape, want[i]) << names[i];
  }
};

std::vector<float> random_x(int64_t T, int64_t d, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> x(T * d);
  for (auto& e : x) e = n(rng);
  return x;
}

void check_fixture(const std::string& file, KDAPath path) {
  LayerFix L(file);
  auto x = L.fx.tensor("in"), eo = L.fx.tensor("out"), es = L.fx.tensor("state_out");
  const int64_t T = x.shape[1];
  ASSERT_EQ(T, int64_t(L.fx.num("T")));
  ASSERT_EQ(es.shape, (std::vector<int64_t>{1, L.dims.H, L.dims.D, L.dims.D}));
  KDAState st;
  st.reset(L.dims);
  KDAScratch scratch;
  std::vector<float> out(T * L.dims.d);
  kda_mixer_forward(out.data(), st, x.data.data(), L.w, L.dims, T, path, scratch);
  const std::string tag = file + (path == KDAPath::Chunked ? " chunked" : " recurrent");
  test::expect_close(out, eo, 1e-5, 1e-4, tag + " out");
  test::expect_close(st.S.host(), es, 1e-5, 1e-4, tag + " state_out");
}

}  // namespace

TEST(KDAMixer, MatchesFixtureOneToken) {
  check_fixture("ops/kda_layer1.json", KDAPath::Recurrent);
  check_fixture("ops/kda_layer1.json", KDAPath::Chunked);
}

TEST(KDAMixer, MatchesFixtureEightTokens) {
  check_fixture("ops/kda_layer8.json", KDAPath::Recurrent);
  check_fixture("ops/kda_layer8.json", KDAPath::Chunked);
}

// Prefill of P tokens, then one-token calls, equals one forward over all tokens: the KDA
// state and all three conv states carry (P = 2 < K-1 exercises the conv-state shift).
TEST(KDAMixer, PrefillThenDecodeEqualsOneForward) {
  LayerFix L("ops/kda_layer8.json");
  std::vector<float> onorm(L.dims.D);
  for (int64_t i = 0; i < L.dims.D; ++i) onorm[i] = 0.5f + 0.07f * float(i);
  L.w.o_norm = onorm.data();
  const int64_t T = 24, d = L.dims.d;
  auto x = random_x(T, d, 5);
  for (KDAPath path : {KDAPath::Recurrent, KDAPath::Chunked}) {
    KDAState whole;
    whole.reset(L.dims);
    KDAScratch scratch;
    std::vector<float> ref(T * d);
    kda_mixer_forward(ref.data(), whole, x.data(), L.w, L.dims, T, path, scratch);
    for (int64_t P : {2, 17}) {
      KDAState st;
      st.reset(L.dims);
      std::vector<float> out(T * d);
      kda_mixer_forward(out.data(), st, x.data(), L.w, L.dims, P, path, scratch);  // same scratch, reused
      for (int64_t t = P; t < T; ++t)
        kda_mixer_forward(out.data() + t * d, st, x.data() + t * d, L.w, L.dims, 1, path, scratch);
      const std::string tag = std::string(path == KDAPath::Chunked ? "chunked" : "recurrent") + " P=" +
                              std::to_string(P);
      test::expect_close(out.data(), ref.data(), T * d, 1e-5, 1e-4, tag + " out");
      test::expect_close(st.S.data(), whole.S.data(), int64_t(st.S.size()), 1e-5, 1e-4, tag + " S");
      test::expect_close(st.conv_q.data(), whole.conv_q.data(), int64_t(st.conv_q.size()), 0, 0, tag + " conv_q");
      test::expect_close(st.conv_k.data(), whole.conv_k.data(), int64_t(st.conv_k.size()), 0, 0, tag + " conv_k");
      test::expect_close(st.conv_v.data(), whole.conv_v.data(), int64_t(st.conv_v.size()), 0, 0, tag + " conv_v");
    }
  }
}

// Chunked (chunk 64: two full chunks and a partial one) == recurrent at T = 150, then both
// continue from their carried state for another 10 tokens. The core output o is compared
// elementwise at the fixture tolerance; the mixer output by relative RMS plus a looser
// elementwise bound: the per-head RMSNorm multiplies o's rounding differences by up to
// eps^-1/2 (about 316) on heads whose output rms is below sqrt(eps), and a few such rows occur.
TEST(KDAMixer, ChunkedEqualsRecurrentT150) {
  LayerFix L("ops/kda_layer8.json");
  std::vector<float> onorm(L.dims.D);
  for (int64_t i = 0; i < L.dims.D; ++i) onorm[i] = 1.3f - 0.05f * float(i);
  L.w.o_norm = onorm.data();
  const int64_t T = 150, T2 = 10, d = L.dims.d, HD = L.dims.H * L.dims.D;
  auto x = random_x(T + T2, d, 9);
  KDAState sr, sc;
  sr.reset(L.dims);
  sc.reset(L.dims);
  KDAScratch scr, scc;
  std::vector<float> outr((T + T2) * d), outc((T + T2) * d);
  kda_mixer_forward(outr.data(), sr, x.data(), L.w, L.dims, T, KDAPath::Recurrent, scr);
  kda_mixer_forward(outc.data(), sc, x.data(), L.w, L.dims, T, KDAPath::Chunked, scc);
  test::expect_close(scc.o.data(), scr.o.data(), T * HD, 1e-5, 1e-4, "chunked vs recurrent core o");
  test::expect_close(sc.S.data(), sr.S.data(), int64_t(sr.S.size()), 1e-5, 1e-4, "chunked vs recurrent S at 150");
  kda_mixer_forward(outr.data() + T * d, sr, x.data() + T * d, L.w, L.dims, T2, KDAPath::Recurrent, scr);
  kda_mixer_forward(outc.data() + T * d, sc, x.data() + T * d, L.w, L.dims, T2, KDAPath::Chunked, scc);
  EXPECT_LT(test::rel_rms(outc.data(), outr.data(), (T + T2) * d), 1e-5);
  test::expect_close(outc.data(), outr.data(), (T + T2) * d, 2e-4, 1e-4, "chunked vs recurrent out");
  test::expect_close(sc.S.data(), sr.S.data(), int64_t(sr.S.size()), 1e-5, 1e-4, "chunked vs recurrent S at 160");
}

// The fixtures' o_norm is all ones, so the gain's indexing is checked here: with a gain that
// differs per channel, out equals W_o(RMSNorm_head(o) * o_norm[i] * sigmoid(W_g x)) recomputed
// in double from the saved core output o and gate logits.
TEST(KDAMixer, OutputNormGainIsPerHeadChannel) {
  LayerFix L("ops/kda_layer8.json");
  const int64_t T = 8, d = L.dims.d, H = L.dims.H, D = L.dims.D, HD = H * D;
  std::vector<float> onorm(D);
  for (int64_t i = 0; i < D; ++i) onorm[i] = 0.2f + 0.1f * float(i);
  L.w.o_norm = onorm.data();
  auto x = L.fx.tensor("in");
  KDAState st;
  st.reset(L.dims);
  KDAScratch s;
  std::vector<float> out(T * d);
  kda_mixer_forward(out.data(), st, x.data.data(), L.w, L.dims, T, KDAPath::Chunked, s);
  std::vector<float> ref(T * d);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> y(HD);
    for (int64_t h = 0; h < H; ++h) {
      const float* o = s.o.data() + (t * H + h) * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(o[i]) * o[i];
      const double r = 1 / std::sqrt(ss / D + L.dims.rms_eps);
      for (int64_t i = 0; i < D; ++i) {
        const double gl = s.gate_lin[t * HD + h * D + i];
        y[h * D + i] = o[i] * r * onorm[i] / (1 + std::exp(-gl));
      }
    }
    for (int64_t j = 0; j < d; ++j) {
      double a = 0;
      for (int64_t c = 0; c < HD; ++c) a += double(L.w.o_proj[j * HD + c]) * y[c];
      ref[t * d + j] = float(a);
    }
  }
  test::expect_close(out.data(), ref.data(), T * d, 1e-5, 1e-4, "o_norm per channel");
  // And the gain matters: the fixture output (unit gain) differs.
  auto eo = L.fx.tensor("out");
  EXPECT_GT(test::rel_rms(out.data(), eo.data.data(), T * d), 1e-2);
}
