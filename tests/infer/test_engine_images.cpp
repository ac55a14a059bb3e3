// Images through the serving engine (infer/engine.h + infer/image_prompt.h) on the tiny
// released-layout model with its random vision encoder (tests/data/k3-release-tiny: patch 4,
// 2 x 2 merge, so a 24 x 24 image is 9 tokens):
//  - a prompt with an image, prefilled in chunks of 4 by the engine, gives the greedy tokens and
//    log-probabilities of one Session prefill with the same splice (the `generate --image` path);
//  - the prefix cache keys on the image: the same image again restores past it, another image
//    behind the same text restores only the text before it, and its reply equals a cold run of
//    that image (were the key the bare ids, it would restore the first image's state);
//  - the placeholder count must match the images; rows of the wrong size are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/fixture.h"
#include "core/error.h"
#include "infer/engine.h"
#include "infer/image_prompt.h"
#include "infer/session.h"
#include "io/tiktoken.h"
#include "model/checkpoint.h"

using namespace k3;
using namespace std::chrono_literals;

namespace {

const std::string kDir = test::data_path("k3-release-tiny");

struct Fixture {
  ModelDir md = open_model_dir(kDir);
  K3Model model = load_model(md);
  VisionModel vis = load_vision_model(kDir, md.config, md.config_path);
  Tiktoken tok = Tiktoken::load(kDir);
};
const Fixture& fx() {
  static const Fixture f;
  return f;
}

Image random_image(int64_t h, int64_t w, uint64_t seed) {
  Image img;
  img.height = h, img.width = w;
  img.rgb.resize(size_t(3 * h * w));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float& v : img.rgb) v = u(rng);
  return img;
}

// "look at this: <|media_pad|> what is it?" as ids.
std::vector<int32_t> prompt_ids() {
  std::vector<int32_t> ids = fx().tok.encode("look at this: ");
  ids.push_back(fx().vis.media_id);
  for (int32_t t : fx().tok.encode(" what is it? say it in words")) ids.push_back(t);
  return ids;
}

struct Out {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  GenerationEvent final;
};

Out run(Engine& e, const ImagePrompt& ip, int64_t n) {
  GenerationRequest q;
  q.prompt = ip.ids;
  q.max_tokens = n;
  q.top_logprobs = 0;
  q.media_id = fx().vis.media_id;
  q.media_rows = std::make_shared<const std::vector<float>>(ip.rows);
  q.cache_key = ip.cache_key;
  auto h = e.submit(std::move(q));
  Out o;
  GenerationEvent ev;
  while (h->next(ev, 60s)) {
    if (ev.final) {
      o.final = ev;
      return o;
    }
    o.ids.push_back(ev.id);
    o.logprobs.push_back(ev.logprob);
  }
  ADD_FAILURE() << "no event within 60 s";
  return o;
}

EngineOptions opts(bool cache) {
  EngineOptions o;
  o.parallel = 2;
  o.ctx = 256;
  o.prefill_chunk = 4;
  o.state_budget_mb = 64;
  o.prefix_cache = cache;
  return o;
}

}  // namespace

TEST(EngineImages, ChunkedPrefillEqualsOneSessionPrefill) {
  const Fixture& f = fx();
  const Image img = random_image(24, 24, 1);
  const ImagePrompt ip = expand_image_prompt(f.vis, prompt_ids(), {&img}, "test");
  ASSERT_EQ(ip.image_tokens, 9);
  ASSERT_EQ(ip.ids.size(), prompt_ids().size() + 8);
  // The reference: one Session prefill with the splice, then greedy decode steps.
  Session s(f.model);
  const EmbedSpliceT<float> splice{f.vis.media_id, ip.rows.data(), ip.image_tokens, nullptr};
  const float* l = s.prefill(ip.ids.data(), int64_t(ip.ids.size()), &splice);
  const int64_t V = f.model.dims().V;
  std::vector<int32_t> want;
  std::vector<double> want_lp;
  for (int i = 0; i < 8; ++i) {
    const int32_t id = int32_t(std::max_element(l, l + V) - l);
    double mx = l[id], z = 0;
    for (int64_t k = 0; k < V; ++k) z += std::exp(double(l[k]) - mx);
    want.push_back(id);
    want_lp.push_back(-std::log(z));
    l = s.step(id);
  }
  Engine e(f.model, opts(false));
  const Out got = run(e, ip, 8);
  EXPECT_EQ(got.ids, want);
  ASSERT_EQ(got.logprobs.size(), want_lp.size());
  for (size_t i = 0; i < want_lp.size(); ++i) EXPECT_NEAR(got.logprobs[i], want_lp[i], 1e-4) << "token " << i;
  // The image matters: zeros in its place change the first token's distribution.
  ImagePrompt zeros = ip;
  std::fill(zeros.rows.begin(), zeros.rows.end(), 0.0f);
  Engine e2(f.model, opts(false));
  const Out z = run(e2, zeros, 1);
  EXPECT_GT(std::abs(z.logprobs[0] - got.logprobs[0]) + (z.ids[0] != got.ids[0] ? 1.0 : 0.0), 1e-4);
}

TEST(EngineImages, PrefixCacheKeysOnTheImage) {
  const Fixture& f = fx();
  const Image a = random_image(24, 24, 2), b = random_image(24, 24, 3);
  const ImagePrompt pa = expand_image_prompt(f.vis, prompt_ids(), {&a}, "test");
  const ImagePrompt pb = expand_image_prompt(f.vis, prompt_ids(), {&b}, "test");
  ASSERT_EQ(pa.ids, pb.ids);  // the same token ids: only the key tells the images apart
  ASSERT_NE(pa.cache_key, pb.cache_key);
  const int64_t image_at = int64_t(std::find(pa.ids.begin(), pa.ids.end(), f.vis.media_id) - pa.ids.begin());
  const int64_t P = int64_t(pa.ids.size());

  Engine e(f.model, opts(true));
  const Out a1 = run(e, pa, 6);
  EXPECT_EQ(a1.final.cached_tokens, 0);
  const Out a2 = run(e, pa, 6);  // the same image: restored past the image
  EXPECT_EQ(a2.final.cached_tokens, (P - 1) / 4 * 4);
  EXPECT_GT(a2.final.cached_tokens, image_at + 9);
  EXPECT_EQ(a2.ids, a1.ids);
  const Out b1 = run(e, pb, 6);  // another image: only the text before it
  EXPECT_EQ(b1.final.cached_tokens, image_at / 4 * 4);
  Engine cold(f.model, opts(false));
  const Out b0 = run(cold, pb, 6);
  EXPECT_EQ(b1.ids, b0.ids);
  ASSERT_EQ(b1.logprobs.size(), b0.logprobs.size());
  for (size_t i = 0; i < b0.logprobs.size(); ++i) EXPECT_NEAR(b1.logprobs[i], b0.logprobs[i], 1e-5) << "token " << i;
  // A distinct image behind the same text gives a distinct distribution (so restoring the
  // first image's state would have been caught above).
  EXPECT_GT(std::abs(b0.logprobs[0] - a1.logprobs[0]) + (b0.ids[0] != a1.ids[0] ? 1.0 : 0.0), 1e-4);
  // The same pixels again, as another Image object: the same key.
  const Image a_copy = a;
  EXPECT_EQ(expand_image_prompt(f.vis, prompt_ids(), {&a_copy}, "test").cache_key, pa.cache_key);
}

TEST(EngineImages, MismatchesAreErrors) {
  const Fixture& f = fx();
  const Image img = random_image(16, 16, 4);
  EXPECT_THROW(expand_image_prompt(f.vis, prompt_ids(), {}, "test"), Error);
  EXPECT_THROW(expand_image_prompt(f.vis, prompt_ids(), {&img, &img}, "test"), Error);
  Engine e(f.model, opts(true));
  GenerationRequest q;
  q.prompt = expand_image_prompt(f.vis, prompt_ids(), {&img}, "test").ids;
  q.media_id = f.vis.media_id;
  q.media_rows = std::make_shared<const std::vector<float>>(size_t(3), 0.0f);  // not 4 rows of 64
  EXPECT_THROW(e.submit(q), Error);
  q.media_rows.reset();
  q.cache_key = {1, 2};
  EXPECT_THROW(e.submit(q), Error);
}
