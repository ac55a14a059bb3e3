// Gated MLA (NoPE) mixer: fixture ops/mla.json (out, the normed latent cache, k_rope);
// absorbed decode == expanded forward; chunked prefill == one-shot; the rope slice matters
// (zeroing k_rope changes the output) but is never rotated (the fixture pins that).
#include <gtest/gtest.h>

#include <cmath>

#include "common/fixture.h"
#include "model/mla_mixer.h"

using namespace k3;

namespace {

struct MLAFixture {
  test::Fixture fx{"ops/mla.json"};
  test::FixTensor x, out, kv_latent, k_rope, qa, qan, qb, kva, kvan, kvb, o, g;
  MLADims dims{};
  int64_t T = 0;

  MLAFixture() {
    x = fx.tensor("in");
    out = fx.tensor("out");
    kv_latent = fx.tensor("kv_latent");
    k_rope = fx.tensor("k_rope");
    qa = fx.tensor("q_a_proj_weight");
    qan = fx.tensor("q_a_layernorm_weight");
    qb = fx.tensor("q_b_proj_weight");
    kva = fx.tensor("kv_a_proj_with_mqa_weight");
    kvan = fx.tensor("kv_a_layernorm_weight");
    kvb = fx.tensor("kv_b_proj_weight");
    o = fx.tensor("o_proj_weight");
    g = fx.tensor("g_proj_weight");
    dims.d = x.shape[2];
    dims.H = int64_t(fx.num("n_heads"));
    dims.q_lora = int64_t(fx.num("q_lora"));
    dims.kv_lora = int64_t(fx.num("kv_lora"));
    dims.nope = int64_t(fx.num("qk_nope"));
    dims.rope = int64_t(fx.num("qk_rope"));
    dims.v = int64_t(fx.num("v_head"));
    dims.output_gate = true;
    dims.rms_eps = fx.num("rms_eps");
    T = x.shape[1];
  }
  MLAWeights weights() const {
    return {qa.data.data(), qan.data.data(), qb.data.data(), kva.data.data(),
            kvan.data.data(), kvb.data.data(), o.data.data(), g.data.data()};
  }
};

}  // namespace

TEST(MLAMixer, MatchesFixture) {
  MLAFixture f;
  EXPECT_NEAR(f.fx.num("scale"), 1 / std::sqrt(double(f.dims.nope + f.dims.rope)), 1e-12);
  MLACache cache;
  MLAScratch s;
  std::vector<float> y(f.T * f.dims.d);
  mla_mixer_forward(y.data(), cache, f.x.data.data(), f.weights(), f.dims, f.T, s);
  test::expect_close(y, f.out, 1e-5, 1e-4, "mla out");
  ASSERT_EQ(cache.n, f.T);
  test::expect_close(cache.c_kv.host(), f.kv_latent, 1e-5, 1e-4, "kv_latent (normed c_kv)");
  test::expect_close(cache.k_rope.host(), f.k_rope, 1e-5, 1e-4, "k_rope (not rotated)");
  // Reusing the cache after clear() and the warm scratch gives the same result.
  cache.clear();
  std::vector<float> y2(y.size());
  mla_mixer_forward(y2.data(), cache, f.x.data.data(), f.weights(), f.dims, f.T, s);
  EXPECT_EQ(y, y2);
}

TEST(MLAMixer, AbsorbedDecodeOfWholeSequenceMatchesFixture) {
  MLAFixture f;
  MLACache cache;
  MLAScratch s;
  std::vector<float> y(f.T * f.dims.d);
  mla_mixer_decode(y.data(), cache, f.x.data.data(), f.weights(), f.dims, f.T, s);
  test::expect_close(y, f.out, 1e-5, 1e-4, "absorbed mla out");
}

TEST(MLAMixer, PrefillThenDecodeStepsMatchOneShotForward) {
  MLAFixture f;
  const int64_t d = f.dims.d, T = f.T;
  MLAScratch s;
  MLACache full;
  std::vector<float> want(T * d);
  mla_mixer_forward(want.data(), full, f.x.data.data(), f.weights(), f.dims, T, s);

  MLACache cache;
  std::vector<float> got(T * d);
  mla_mixer_forward(got.data(), cache, f.x.data.data(), f.weights(), f.dims, 3, s);
  for (int64_t t = 3; t < T; ++t)
    mla_mixer_decode(got.data() + t * d, cache, f.x.data.data() + t * d, f.weights(), f.dims, 1, s);
  EXPECT_EQ(cache.n, T);
  test::expect_close(got.data(), want.data(), T * d, 1e-5, 1e-5, "prefill 3 + 3 absorbed decode steps");
  test::expect_close(cache.c_kv.data(), full.c_kv.data(), T * f.dims.kv_lora, 1e-6, 1e-6, "c_kv cache");
  test::expect_close(cache.k_rope.data(), full.k_rope.data(), T * f.dims.rope, 1e-6, 1e-6, "k_rope cache");

  // Chunked expanded prefill (2 + 4 tokens) too.
  cache.clear();
  mla_mixer_forward(got.data(), cache, f.x.data.data(), f.weights(), f.dims, 2, s);
  mla_mixer_forward(got.data() + 2 * d, cache, f.x.data.data() + 2 * d, f.weights(), f.dims, T - 2, s);
  test::expect_close(got.data(), want.data(), T * d, 1e-5, 1e-5, "chunked prefill 2 + 4");
}

TEST(MLAMixer, RopeSliceContributesButIsNotRotated) {
  MLAFixture f;
  // Zero the k_rope rows of kv_a_proj_with_mqa: k_rope becomes 0 and the output must move,
  // so the fixture's match above depends on the un-rotated rope slice being used.
  auto kva = f.kva.data;
  for (int64_t r = f.dims.kv_lora; r < f.dims.kv_lora + f.dims.rope; ++r)
    for (int64_t c = 0; c < f.dims.d; ++c) kva[r * f.dims.d + c] = 0;
  MLAWeights w = f.weights();
  w.kv_a_proj = kva.data();
  MLACache cache;
  MLAScratch s;
  std::vector<float> y(f.T * f.dims.d);
  mla_mixer_forward(y.data(), cache, f.x.data.data(), w, f.dims, f.T, s);
  double max_diff = 0;
  for (int64_t i = 1 * f.dims.d; i < f.T * f.dims.d; ++i)  // token 0 attends only to itself
    max_diff = std::max(max_diff, double(std::fabs(y[i] - f.out.data[i])));
  EXPECT_GT(max_diff, 1e-2);
  // Token 0 sees one key: softmax is 1 whatever the scores, so its output is unchanged.
  for (int64_t i = 0; i < f.dims.d; ++i) EXPECT_NEAR(y[i], f.out.data[i], 1e-4);
}

TEST(MLAMixer, OutputGateIsApplied) {
  MLAFixture f;
  MLADims nogate = f.dims;
  nogate.output_gate = false;
  MLACache c1, c2;
  MLAScratch s;
  std::vector<float> y1(f.T * f.dims.d), y2(f.T * f.dims.d);
  mla_mixer_forward(y1.data(), c1, f.x.data.data(), f.weights(), nogate, f.T, s);
  mla_mixer_decode(y2.data(), c2, f.x.data.data(), f.weights(), nogate, f.T, s);
  test::expect_close(y2.data(), y1.data(), f.T * f.dims.d, 1e-5, 1e-4, "ungated: absorbed vs expanded");
  EXPECT_GT(test::rel_rms(y1.data(), f.out.data.data(), f.T * f.dims.d), 0.1);
}

// Log-length attention scaling (MLADims::logn_base, an eval option, not K3): off within the
// base, the query of position p scaled by ln(p + 1) / ln(base) past it, the same in the
// expanded prefill and the absorbed decode, refused by a training forward.
TEST(MLAMixer, LognScalingScalesTheQueriesPastItsBase) {
  MLAFixture f;
  const int64_t d = f.dims.d, T = f.T;
  ASSERT_GE(T, 4);
  MLAScratch s;
  auto forward = [&](const MLADims& dm, MLAWeights w) {
    MLACache c;
    std::vector<float> y(T * d);
    mla_mixer_forward(y.data(), c, f.x.data.data(), w, dm, T, s);
    return y;
  };
  const std::vector<float> off = forward(f.dims, f.weights());
  MLADims within = f.dims;
  within.logn_base = T;  // every p + 1 <= T: no query is scaled
  EXPECT_EQ(forward(within, f.weights()), off);
  EXPECT_EQ(mla_logn_factor(within, T - 1), 1.0);

  MLADims on = f.dims;
  on.logn_base = 2;
  const std::vector<float> y = forward(on, f.weights());
  for (int64_t i = 0; i < 2 * d; ++i) EXPECT_EQ(y[i], off[i]) << "positions 0 and 1 are within the base";
  EXPECT_GT(test::rel_rms(y.data() + 2 * d, off.data() + 2 * d, (T - 2) * d), 1e-3);

  // The last position against an independent form: logn off, q_b_proj scaled by the factor
  // (q is linear in it), one absorbed decode step after a plain prefill of the rest.
  const double fac = mla_logn_factor(on, T - 1);
  EXPECT_NEAR(fac, std::log(double(T)) / std::log(2.0), 1e-15);
  std::vector<float> qb = f.qb.data;
  for (float& v : qb) v = float(double(v) * fac);
  MLAWeights wq = f.weights();
  wq.q_b_proj = qb.data();
  MLACache c;
  std::vector<float> head((T - 1) * d), last(d);
  mla_mixer_forward(head.data(), c, f.x.data.data(), f.weights(), f.dims, T - 1, s);
  mla_mixer_decode(last.data(), c, f.x.data.data() + (T - 1) * d, wq, f.dims, 1, s);
  test::expect_close(y.data() + (T - 1) * d, last.data(), d, 1e-5, 1e-5, "logn at the last position");

  // Prefill 3 with logn then absorbed decode steps with logn: the one-shot forward's output.
  MLACache c2;
  std::vector<float> got(T * d);
  mla_mixer_forward(got.data(), c2, f.x.data.data(), f.weights(), on, 3, s);
  for (int64_t t = 3; t < T; ++t)
    mla_mixer_decode(got.data() + t * d, c2, f.x.data.data() + t * d, f.weights(), on, 1, s);
  test::expect_close(got.data(), y.data(), T * d, 1e-5, 1e-5, "logn: prefill 3 + decode steps");

  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the mixer's OpenMP threads
  MLACache c3;
  MLASaved saved;
  std::vector<float> z(T * d);
  EXPECT_DEATH(mla_mixer_forward(z.data(), c3, f.x.data.data(), f.weights(), on, T, s, &saved), "inference option");
}
