// The joint image-text step (train/vision_step.h): image tokens replace the expanded media
// placeholders in the text stream, and the text loss trains the encoder. In double, on a small
// K3 stack (5 layers, MLA and KDA, MoE) with a tiny encoder and two images: every vision
// tensor's and a sample of text tensors' gradients against central finite differences of the
// same masked loss; the placeholder's embedding row gets no gradient from image positions;
// expansion and count errors are one clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "core/threads.h"
#include "io/config.h"
#include "common/grad_check.h"
#include "model/init.h"
#include "train/vision_step.h"

using namespace k3;

namespace {

K3Config small_text_config() {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.hidden_size = 16, c.num_hidden_layers = 3, c.vocab_size = 24;
  c.kda_num_heads = 2, c.kda_head_dim = 8, c.full_attn_layers = {3}, c.kda_layers = {1, 2};
  c.num_attention_heads = 2, c.q_lora_rank = 8, c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 8, c.qk_rope_head_dim = 4, c.v_head_dim = 8;
  c.num_experts = 4, c.num_experts_per_token = 2, c.num_shared_experts = 1;
  c.routed_expert_hidden_size = 8, c.moe_intermediate_size = 8, c.first_k_dense_replace = 1, c.intermediate_size = 8;
  c.attn_res_block_size = 2;
  validate_config(c, "small_text_config");
  return c;
}

VisionDims small_vision(int64_t text_width) {
  VisionDims d;
  d.layers = 1, d.width = 8, d.heads = 2, d.qkv = 8, d.mlp = 8, d.patch = 2;
  d.pos_h = 2, d.pos_w = 2, d.merge_h = 2, d.merge_w = 2, d.text_width = text_width;
  return d;
}

}  // namespace

TEST(VisionStep, JointGradientsMatchFiniteDifferences) {
  set_num_threads(1);
  const K3Config c = small_text_config();
  K3ModelT<double> m(init_weights(c, {3, ExpertStorage::Plain, 0.3}));
  const VisionDims vd = small_vision(c.hidden_size);
  const VisionLayout vl(vd);
  std::vector<float> vf(size_t(vl.total));
  init_vision_params(vf.data(), vl, 5);
  std::mt19937 rng(2);
  std::normal_distribution<double> nd(0.0, 0.4);
  std::vector<double> vp(vf.size());
  for (size_t i = 0; i < vl.specs.size(); ++i)
    for (int64_t k = 0; k < vl.specs[i].numel(); ++k)
      vp[size_t(vl.offsets[i] + k)] = vl.specs[i].shape.size() == 1 ? 1.0 + nd(rng) : nd(rng);
  const int32_t media = int32_t(c.vocab_size - 1);
  VisionBatch<double> imgs;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{4, 8}, {4, 4}}) {
    std::vector<float> px(size_t(3 * h * w));
    for (float& x : px) x = u(rng);
    append_image(imgs, vd, px.data(), h, w);
  }
  const std::vector<int64_t> counts = {2, 1};
  const std::vector<int32_t> tokens = expand_media_placeholders({1, media, 5, 7, media, 9, 3, 2}, counts, media);
  ASSERT_EQ(tokens.size(), 9u);
  const int64_t T = int64_t(tokens.size()) - 1;
  std::vector<uint8_t> mask(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) mask[size_t(t)] = tokens[size_t(t + 1)] != media;  // image tokens are not targets
  LossOptions opt;
  opt.target_mask = mask.data();
  const VisionModelRef vm{&vl, &vd, media};
  TrainScratchT<double> s;
  VisionScratchT<double> vs;
  std::vector<double> g(size_t(m.weights().size()), 0.0), vg(vp.size(), 0.0);
  const SequenceResult res =
      vision_forward_backward_t<double>(m, vp.data(), vm, imgs, tokens.data(), T, 1.0, g.data(), vg.data(), s, vs, opt);
  EXPECT_EQ(res.n_targets, T - 3);
  auto loss = [&] { return vision_forward_loss_t<double>(m, vp.data(), vm, imgs, tokens.data(), T, s, vs, opt).loss_sum; };
  EXPECT_NEAR(loss(), res.loss_sum, 1e-12 * std::fabs(res.loss_sum));
  for (size_t i = 0; i < vl.specs.size(); ++i)
    test::check_fd(vp.data() + vl.offsets[i], vg.data() + vl.offsets[i], vl.specs[i].numel(), loss, vl.specs[i].name,
                   1e-5, 8);
  // Text tensors through the spliced stream: the embedding (not the placeholder row), lm_head,
  // the first layer's MLA/KDA input projections.
  const ParamLayout& lay = m.weights().layout();
  double* P = m.params();
  for (const std::string& name : {std::string("language_model.lm_head.weight"), kModelPrefix + "embed_tokens.weight"}) {
    const size_t i = lay.index(name);
    test::check_fd(P + lay.offset(i), g.data() + lay.offset(i), lay.spec(i).numel(), loss, name, 1e-5, 16);
  }
  const size_t e = lay.index(kModelPrefix + "embed_tokens.weight");
  for (int64_t k = 0; k < c.hidden_size; ++k) EXPECT_EQ(g[size_t(lay.offset(e) + media * c.hidden_size + k)], 0.0);
  set_num_threads(0);
}

TEST(VisionStep, PlaceholderCountsAreChecked) {
  EXPECT_THROW(expand_media_placeholders({1, 9, 2}, {4, 4}, 9), Error);
  EXPECT_THROW(expand_media_placeholders({9, 9}, {4}, 9), Error);
  EXPECT_EQ(expand_media_placeholders({1, 9, 2}, {3}, 9), (std::vector<int32_t>{1, 9, 9, 9, 2}));
  // The stack refuses images whose token count differs from the placeholders in the sequence.
  const K3Config c = small_text_config();
  K3Model m(init_weights(c, {3, ExpertStorage::Plain, 0.02}));
  std::vector<float> rows(size_t(2 * c.hidden_size), 0.5f), logits(size_t(3 * c.vocab_size));
  const int32_t ids[3] = {1, 23, 2};
  EmbedSpliceT<float> sp{23, rows.data(), 2, nullptr};
  DecodeState st = m.new_state();
  ForwardScratch fs;
  try {
    m.forward(logits.data(), ids, 3, st, fs, {}, nullptr, &sp);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 media placeholder"), std::string::npos) << e.what();
  }
}
