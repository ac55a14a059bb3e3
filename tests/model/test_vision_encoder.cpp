// The vision encoder (model/vision_encoder.h) without training:
//  - every parameter's gradient against central finite differences in double, on a packed
//    batch of two images of different, non-square sizes;
//  - a packed batch gives each image the output it gets alone (block-diagonal attention);
//  - grids and token counts follow the padding formula (224 x 224 at patch 14: 64 tokens);
//  - the released-layout fixture's vision tensors load with their shapes checked, a wrong
//    shape is refused naming the tensor; vision_config variants K3 does not have are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <array>
#include <fstream>
#include <iterator>
#include <random>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "common/grad_check.h"
#include "model/vision_config.h"
#include "model/vision_encoder.h"

using namespace k3;

namespace {

VisionDims tiny_dims() {
  VisionDims d;
  d.layers = 2, d.width = 8, d.heads = 2, d.qkv = 8, d.mlp = 12, d.patch = 2;
  d.pos_h = 3, d.pos_w = 3, d.merge_h = 2, d.merge_w = 2, d.text_width = 6;
  return d;
}

std::vector<float> random_image(int64_t h, int64_t w, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> v(size_t(3 * h * w));
  for (float& x : v) x = u(rng);
  return v;
}

template <typename T>
std::vector<T> random_params(const VisionLayout& L, unsigned seed, double sd) {
  std::vector<float> f(size_t(L.total));
  init_vision_params(f.data(), L, seed);
  std::mt19937 rng(seed + 5);
  std::normal_distribution<double> nd(0.0, sd);
  std::vector<T> p(f.size());
  // Larger weights than the init recipe so every part moves the output; gains perturbed.
  for (size_t i = 0; i < L.specs.size(); ++i)
    for (int64_t k = 0; k < L.specs[i].numel(); ++k) {
      const size_t j = size_t(L.offsets[i] + k);
      p[j] = L.specs[i].shape.size() == 1 ? T(1.0 + 0.3 * nd(rng) / sd) : T(nd(rng) * (L.specs[i].name.find("pos_emb") != std::string::npos ? 2.0 : 1.0));
    }
  return p;
}

}  // namespace

TEST(VisionEncoder, GradientsMatchFiniteDifferences) {
  const VisionDims d = tiny_dims();
  const VisionLayout layout(d);
  std::vector<double> W = random_params<double>(layout, 1, 0.4);
  VisionBatch<double> batch;
  const std::vector<float> a = random_image(8, 4, 2), b = random_image(3, 5, 3);  // 8x4 -> grid 4x2; 3x5 -> 2x4
  append_image(batch, d, a.data(), 8, 4);
  append_image(batch, d, b.data(), 3, 5);
  ASSERT_EQ(batch.token_count(d), 2 + 2);
  const int64_t N = batch.token_count(d);
  const std::vector<double> r = test::randn(N * d.text_width, 7);
  auto loss = [&] {
    std::vector<double> out(size_t(N * d.text_width));
    vision_forward<double>(out.data(), nullptr, W.data(), layout, d, batch);
    return test::dot(out, r);
  };
  VisionActs<double> acts;
  std::vector<double> out(size_t(N * d.text_width)), g(W.size(), 0.0);
  vision_forward<double>(out.data(), &acts, W.data(), layout, d, batch);
  vision_backward<double>(g.data(), r.data(), acts, W.data(), layout, d, batch);
  for (size_t i = 0; i < layout.specs.size(); ++i)
    test::check_fd(W.data() + layout.offsets[i], g.data() + layout.offsets[i], layout.specs[i].numel(), loss,
                   layout.specs[i].name, 1e-5, 24);
}

TEST(VisionEncoder, FloatPathEqualsDouble) {
  const VisionDims d = tiny_dims();
  const VisionLayout layout(d);
  const std::vector<double> Wd = random_params<double>(layout, 4, 0.3);
  const std::vector<float> Wf(Wd.begin(), Wd.end());
  VisionBatch<double> bd;
  VisionBatch<float> bf;
  const std::vector<float> a = random_image(6, 10, 5);
  append_image(bd, d, a.data(), 6, 10);
  append_image(bf, d, a.data(), 6, 10);
  const int64_t N = bd.token_count(d);
  std::vector<double> od(size_t(N * d.text_width));
  std::vector<float> of(od.size());
  vision_forward<double>(od.data(), nullptr, Wd.data(), layout, d, bd);
  vision_forward<float>(of.data(), nullptr, Wf.data(), layout, d, bf);
  EXPECT_LT(test::rel_rms_mixed(of.data(), od.data(), int64_t(od.size())), 1e-5);
}

TEST(VisionEncoder, PackedBatchGivesEachImageItsOwnOutput) {
  VisionDims d = tiny_dims();
  const VisionLayout layout(d);
  const std::vector<float> W = random_params<float>(layout, 9, 0.3);
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{8, 8}, {4, 12}, {13, 3}};
  VisionBatch<float> packed;
  std::vector<std::vector<float>> imgs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    imgs.push_back(random_image(sizes[i].first, sizes[i].second, unsigned(20 + i)));
    append_image(packed, d, imgs.back().data(), sizes[i].first, sizes[i].second);
  }
  const int64_t N = packed.token_count(d);
  std::vector<float> out(size_t(N * d.text_width));
  vision_forward<float>(out.data(), nullptr, W.data(), layout, d, packed);
  int64_t t0 = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    VisionBatch<float> one;
    append_image(one, d, imgs[i].data(), sizes[i].first, sizes[i].second);
    const int64_t n = one.token_count(d);
    std::vector<float> alone(size_t(n * d.text_width));
    vision_forward<float>(alone.data(), nullptr, W.data(), layout, d, one);
    double err = 0, scale = 0;
    for (int64_t k = 0; k < n * d.text_width; ++k) {
      err = std::max(err, double(std::fabs(alone[size_t(k)] - out[size_t(t0 * d.text_width + k)])));
      scale = std::max(scale, double(std::fabs(alone[size_t(k)])));
    }
    EXPECT_LE(err, 1e-5 * scale) << "image " << i;
    t0 += n;
  }
  EXPECT_EQ(t0, N);
}

TEST(VisionEncoder, GridsAndTokenCountsFollowThePaddingFormula) {
  VisionDims k3d;  // released defaults: patch 14, merge 2 x 2
  EXPECT_EQ(k3d.patch, 14);
  const ImageGrid g = image_grid(k3d, 224, 224);
  EXPECT_EQ(g.h, 16);
  EXPECT_EQ(g.w, 16);
  EXPECT_EQ(image_token_count(k3d, g), 64);
  // Padded up to multiples of 28: 225 x 300 -> 252 x 308 -> grid 18 x 22 -> 9 x 11 tokens.
  const ImageGrid p = image_grid(k3d, 225, 300);
  EXPECT_EQ(p.h, 18);
  EXPECT_EQ(p.w, 22);
  EXPECT_EQ(image_token_count(k3d, p), 99);
  for (int64_t H : {1, 27, 28, 29, 56, 100})
    for (int64_t Wd : {1, 28, 57, 333}) {
      const ImageGrid q = image_grid(k3d, H, Wd);
      EXPECT_EQ(image_token_count(k3d, q), ((H + 27) / 28) * ((Wd + 27) / 28)) << H << "x" << Wd;
    }
  // Non-square: the grid is rows x columns, so the rotary row angle follows y and the padding
  // of a 3-row image stays in the bottom row of patches.
  const VisionDims d = tiny_dims();
  VisionBatch<float> b;
  const std::vector<float> img = random_image(3, 9, 1);
  append_image(b, d, img.data(), 3, 9);
  ASSERT_EQ(b.grids[0].h, 2);
  ASSERT_EQ(b.grids[0].w, 6);  // 9 -> 12 pixels -> 6 patches
  // Patch (1, 4): rows 2-3 (row 3 is padding), columns 8-9 (9 is padding): channel 0 entries.
  const float* row = b.patches.data() + (1 * 6 + 4) * d.patch_values();
  EXPECT_FLOAT_EQ(row[0], (img[size_t(2 * 9 + 8)] - 0.5f) / 0.5f);
  EXPECT_EQ(row[1], 0.0f);
  EXPECT_EQ(row[2], 0.0f);
  EXPECT_EQ(row[3], 0.0f);
}

TEST(VisionEncoder, ReleasedFixtureLoadsWithShapesChecked) {
  const std::string dir = std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny";
  const K3Config cfg = load_config(dir + "/config.json");
  const VisionDims d = resolve_vision_dims(cfg, dir + "/config.json");
  EXPECT_EQ(d.layers, 2);
  EXPECT_EQ(d.width, 16);
  EXPECT_EQ(d.patch, 4);
  EXPECT_EQ(d.pos_h, 4);
  EXPECT_EQ(d.text_width, cfg.hidden_size);
  const VisionLayout layout(d);
  const CheckpointReader ck = CheckpointReader::open(dir);
  std::vector<float> W(size_t(layout.total));
  load_vision_params(W.data(), layout, ck);
  // Run it on a 20 x 12 image: grid 6 x 4 (padded to 24 x 16), 6 tokens, finite output.
  VisionBatch<float> b;
  const std::vector<float> img = random_image(20, 12, 3);
  append_image(b, d, img.data(), 20, 12);
  EXPECT_EQ(b.token_count(d), 6);
  std::vector<float> out(size_t(6 * d.text_width));
  vision_forward<float>(out.data(), nullptr, W.data(), layout, d, b);
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
  // A config whose width disagrees with the stored tensors is refused, naming the tensor.
  VisionDims wrong = d;
  wrong.mlp = 40;
  const VisionLayout wl(wrong);
  std::vector<float> W2(size_t(wl.total));
  try {
    load_vision_params(W2.data(), wl, ck);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vision_tower.encoder.blocks.0.mlp.fc0.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected [40, 16]"), std::string::npos) << e.what();
  }
}

TEST(VisionEncoder, UnsupportedVariantsAreRefused) {
  const std::string dir = std::string(K3_TEST_DATA_DIR) + "/k3-release-tiny";
  const K3Config base = load_config(dir + "/config.json");
  EXPECT_EQ(base.vision.norm_type, "rmsnorm");
  EXPECT_EQ(base.vision.pos_emb_interpolation_mode, "bilinear");
  // Round trip: the written config parses to the same vision fields.
  const K3Config back = parse_config(config_to_hf_json(base), "roundtrip");
  EXPECT_EQ(back.vision.init_pos_emb_height, 4);
  EXPECT_EQ(back.vision.patch_size, 4);
  std::string text;
  {
    std::ifstream f(dir + "/config.json");
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  for (const auto& [from, to, field] : std::vector<std::array<std::string, 3>>{
           {"\"norm_type\": \"rmsnorm\"", "\"norm_type\": \"layernorm\"", "vision_config.norm_type"},
           {"\"attn_bias\": false", "\"attn_bias\": true", "vision_config.attn_bias"},
           {"\"pos_emb_interpolation_mode\": \"bilinear\"", "\"pos_emb_interpolation_mode\": \"bicubic\"",
            "vision_config.pos_emb_interpolation_mode"},
           {"\"mm_projector_type\": \"patchmergerv2\"", "\"mm_projector_type\": \"mlp\"", "vision_config.mm_projector_type"}}) {
    std::string t = text;
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    try {
      parse_config(t, "cfg.json");
      FAIL() << field << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  K3Config c = base;
  c.vision.qkv_hidden_size = 12, c.vision.num_attention_heads = 2;  // head dim 6: not a multiple of 4
  EXPECT_THROW(resolve_vision_dims(c, "x.json"), Error);
  c = base;
  c.vision.present = false;
  EXPECT_THROW(resolve_vision_dims(c, "x.json"), Error);
}
