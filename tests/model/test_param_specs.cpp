// The parameter table against the fixtures: for the tiny config every weight in
// layer_kda.json / layer_mla.json (whole decoder layers), mla.json, kda_layer8.json and
// moe.json maps to a table entry of the same shape, and the fixture layers hold exactly the
// table's tensors for that layer. Also: unique names, K3 tensor counts, the MXFP4 stored
// layout (mxfp4.json names a real K3 expert matrix) and the routed-expert name helpers.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <unordered_set>

#include "common/fixture.h"
#include "io/config.h"
#include "model/param_specs.h"

namespace {

k3::K3Config load(const char* name) { return k3::load_config(std::string(K3_SOURCE_DIR) + "/configs/" + name); }

std::map<std::string, k3::ParamSpec> by_name(const std::vector<k3::ParamSpec>& specs) {
  std::map<std::string, k3::ParamSpec> m;
  for (const auto& s : specs) m.emplace(s.name, s);
  return m;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// Fixture key (flattened with '_') -> table name suffix after "layers.{i}.".
std::string map_layer_key(const std::string& key) {
  static const std::map<std::string, std::string> mlp = {
      {"mlp_e_score_correction_bias", "block_sparse_moe.gate.e_score_correction_bias"},
      {"mlp_gate_weight", "block_sparse_moe.gate.weight"},
      {"mlp_down_weight", "block_sparse_moe.routed_expert_down_proj.weight"},
      {"mlp_up_weight", "block_sparse_moe.routed_expert_up_proj.weight"},
      {"mlp_norm_weight", "block_sparse_moe.routed_expert_norm.weight"},
      {"mlp_shared_w1_weight", "block_sparse_moe.shared_experts.gate_proj.weight"},
      {"mlp_shared_w3_weight", "block_sparse_moe.shared_experts.up_proj.weight"},
      {"mlp_shared_w2_weight", "block_sparse_moe.shared_experts.down_proj.weight"},
      {"self_attn_A_log", "self_attn.A_log"},
      {"self_attn_dt_bias", "self_attn.dt_bias"},
      {"self_attn_kv_a_proj_with_mqa_weight", "self_attn.kv_a_proj_with_mqa.weight"},
  };
  if (auto it = mlp.find(key); it != mlp.end()) return it->second;
  if (starts_with(key, "mlp_experts_")) {  // mlp_experts_{e}_w{n}_weight
    std::string rest = key.substr(12);
    size_t u = rest.find('_');
    return "block_sparse_moe.experts." + rest.substr(0, u) + "." + rest.substr(u + 1, 2) + ".weight";
  }
  if (starts_with(key, "self_attn_")) {  // self_attn_<proj>_weight
    std::string mid = key.substr(10, key.size() - 10 - 7);
    EXPECT_EQ(key.substr(key.size() - 7), "_weight") << key;
    return "self_attn." + mid + ".weight";
  }
  // input_layernorm_weight, self_attention_res_proj_weight, ...
  EXPECT_EQ(key.substr(key.size() - 7), "_weight") << key;
  return key.substr(0, key.size() - 7) + ".weight";
}

const std::set<std::string> kNotWeights = {"in", "out", "block_residual_in", "block_residual_out", "state_out",
                                           "kv_latent", "k_rope"};

// Checks a whole-layer fixture: same set of tensors as the table's layer, same shapes.
void check_layer_fixture(const char* file) {
  k3::K3Config c = load("tiny.json");
  k3::test::Fixture fx(std::string("ops/") + file);
  const int64_t layer = fx.json().at("layer_idx").get<int64_t>();
  EXPECT_EQ(c.is_mla_layer(layer), fx.json().at("is_mla").get<bool>()) << file;
  const std::string prefix = k3::layer_prefix(layer);
  std::set<std::string> table_names;
  std::map<std::string, k3::Shape> table_shapes;
  for (const auto& s : k3::k3_param_specs(c)) {
    if (s.layer != layer) continue;
    table_names.insert(s.name);
    table_shapes[s.name] = s.shape;
  }
  std::set<std::string> fixture_names;
  for (const auto& [key, v] : fx.json().items()) {
    if (!v.is_object() || kNotWeights.count(key)) continue;
    std::string name = prefix + map_layer_key(key);
    fixture_names.insert(name);
    ASSERT_TRUE(table_shapes.count(name)) << file << ": " << key << " -> " << name << " not in table";
    EXPECT_EQ(table_shapes[name], v.at("shape").get<k3::Shape>()) << file << ": " << name;
  }
  EXPECT_EQ(fixture_names, table_names) << file;
  EXPECT_GT(table_names.size(), 30u);
}

}  // namespace

TEST(ParamSpecs, NamesUniqueAndWellFormed) {
  for (const char* f : {"tiny.json", "small-896.json", "mid-1024.json"}) {
    k3::K3Config c = load(f);
    auto specs = k3::k3_param_specs(c);
    std::unordered_set<std::string> seen;
    for (const auto& s : specs) {
      EXPECT_TRUE(seen.insert(s.name).second) << f << ": duplicate " << s.name;
      EXPECT_TRUE(starts_with(s.name, k3::kModelPrefix) || s.name == k3::kLmHeadName) << s.name;
      EXPECT_GT(s.numel(), 0) << s.name;
      EXPECT_EQ(s.expert >= 0, s.component == k3::Component::RoutedExperts) << s.name;
      EXPECT_EQ(k3::is_routed_expert_weight(s.name), s.component == k3::Component::RoutedExperts) << s.name;
      if (s.layer >= 0) {
        EXPECT_TRUE(starts_with(s.name, k3::layer_prefix(s.layer))) << s.name;
      }
    }
  }
}

TEST(ParamSpecs, TinyLayerKdaMatchesFixture) { check_layer_fixture("layer_kda.json"); }
TEST(ParamSpecs, TinyLayerMlaMatchesFixture) { check_layer_fixture("layer_mla.json"); }

TEST(ParamSpecs, TinyMixerAndMoeFixturesMatch) {
  k3::K3Config c = load("tiny.json");
  auto t = by_name(k3::k3_param_specs(c));
  auto check = [&](const char* file, int64_t layer, const std::map<std::string, std::string>& keys) {
    k3::test::Fixture fx(std::string("ops/") + file);
    for (const auto& [key, suffix] : keys) {
      std::string name = k3::layer_prefix(layer) + suffix;
      ASSERT_TRUE(t.count(name)) << name;
      EXPECT_EQ(t[name].shape, fx.tensor(key).shape) << file << ": " << key << " vs " << name;
    }
  };
  const std::string a = "self_attn.";
  check("kda_layer8.json", 0,
        {{"q_proj", a + "q_proj.weight"}, {"k_proj", a + "k_proj.weight"}, {"v_proj", a + "v_proj.weight"},
         {"g_proj", a + "g_proj.weight"}, {"o_proj", a + "o_proj.weight"}, {"f_a", a + "f_a_proj.weight"},
         {"f_b", a + "f_b_proj.weight"}, {"b_proj", a + "b_proj.weight"}, {"q_conv", a + "q_conv1d.weight"},
         {"k_conv", a + "k_conv1d.weight"}, {"v_conv", a + "v_conv1d.weight"}, {"A_log", a + "A_log"},
         {"dt_bias", a + "dt_bias"}, {"o_norm", a + "o_norm.weight"}});
  check("mla.json", 7,  // layer 8 (1-based) is MLA in the tiny config
        {{"q_a_proj_weight", a + "q_a_proj.weight"}, {"q_a_layernorm_weight", a + "q_a_layernorm.weight"},
         {"q_b_proj_weight", a + "q_b_proj.weight"}, {"kv_a_proj_with_mqa_weight", a + "kv_a_proj_with_mqa.weight"},
         {"kv_a_layernorm_weight", a + "kv_a_layernorm.weight"}, {"kv_b_proj_weight", a + "kv_b_proj.weight"},
         {"o_proj_weight", a + "o_proj.weight"}, {"g_proj_weight", a + "g_proj.weight"}});
  const std::string m = "block_sparse_moe.";
  std::map<std::string, std::string> moe = {
      {"e_score_correction_bias", m + "gate.e_score_correction_bias"}, {"gate_weight", m + "gate.weight"},
      {"down_weight", m + "routed_expert_down_proj.weight"}, {"up_weight", m + "routed_expert_up_proj.weight"},
      {"norm_weight", m + "routed_expert_norm.weight"}, {"shared_w1_weight", m + "shared_experts.gate_proj.weight"},
      {"shared_w3_weight", m + "shared_experts.up_proj.weight"},
      {"shared_w2_weight", m + "shared_experts.down_proj.weight"}};
  for (int e = 0; e < 8; ++e)
    for (const char* w : {"w1", "w2", "w3"})
      moe["experts_" + std::to_string(e) + "_" + w + "_weight"] =
          m + "experts." + std::to_string(e) + "." + w + ".weight";
  check("moe.json", 5, moe);
}

TEST(ParamSpecs, GlobalTensorsAndTiedEmbeddings) {
  k3::K3Config c = load("tiny.json");
  auto t = by_name(k3::k3_param_specs(c));
  EXPECT_EQ(t.at(k3::kModelPrefix + "embed_tokens.weight").shape, (k3::Shape{256, 128}));
  EXPECT_EQ(t.at(k3::kLmHeadName).shape, (k3::Shape{256, 128}));
  EXPECT_EQ(t.at(k3::kModelPrefix + "norm.weight").component, k3::Component::FinalNorm);
  EXPECT_EQ(t.at(k3::kModelPrefix + "output_attn_res_proj.weight").shape, (k3::Shape{1, 128}));
  EXPECT_EQ(t.at(k3::kModelPrefix + "output_attn_res_norm.weight").layer, -1);
  // The names k3cpp wrote before the release are known, and map back (release_layout.h).
  EXPECT_EQ(k3::legacy_param_name(k3::kOutputAttnResNormName), k3::kModelPrefix + "final_res_norm.weight");
  EXPECT_EQ(k3::released_param_name(k3::kModelPrefix + "final_res_proj.weight"), k3::kOutputAttnResProjName);
  EXPECT_EQ(k3::legacy_param_name(k3::kModelPrefix + "norm.weight"), "");
  EXPECT_EQ(k3::released_param_name(k3::kOutputAttnResNormName), "");
  EXPECT_TRUE(k3::is_vision_tensor_name("mm_projector.proj.0.weight"));
  EXPECT_FALSE(k3::is_vision_tensor_name("language_model.vision_tower.x"));
  // Layer 0 is dense (first_k_dense_replace = 1): SiTU-GLU FFN, no router.
  EXPECT_EQ(t.at(k3::layer_prefix(0) + "mlp.down_proj.weight").shape, (k3::Shape{128, 96}));
  EXPECT_FALSE(t.count(k3::layer_prefix(0) + "block_sparse_moe.gate.weight"));
  c.tie_word_embeddings = true;
  EXPECT_FALSE(by_name(k3::k3_param_specs(c)).count(k3::kLmHeadName));
}

TEST(ParamSpecs, K3TableCounts) {
  k3::K3Config c = load("kimi-k3.json");
  auto specs = k3::k3_param_specs(c);
  std::map<k3::Component, int64_t> n;
  std::unordered_set<std::string> seen;
  for (const auto& s : specs) {
    ++n[s.component];
    seen.insert(s.name);
  }
  EXPECT_EQ(seen.size(), specs.size());
  EXPECT_EQ(n[k3::Component::RoutedExperts], 92 * 896 * 3);
  EXPECT_EQ(n[k3::Component::MLA], 24 * 8);
  EXPECT_EQ(n[k3::Component::KDA], 69 * 14);
  EXPECT_EQ(n[k3::Component::DenseFFN], 3);
  EXPECT_EQ(n[k3::Component::Router], 92 * 2);
  EXPECT_EQ(n[k3::Component::LatentProj], 92 * 3);
  EXPECT_EQ(n[k3::Component::SharedExperts], 92 * 3);
  EXPECT_EQ(n[k3::Component::Norm], 93 * 2);
  EXPECT_EQ(n[k3::Component::AttnRes], 93 * 4 + 2);
  auto t = by_name(specs);
  const std::string l1 = k3::layer_prefix(1);
  EXPECT_EQ(t.at(l1 + "block_sparse_moe.experts.0.w1.weight").shape, (k3::Shape{3072, 3584}));
  EXPECT_EQ(t.at(l1 + "block_sparse_moe.experts.895.w2.weight").shape, (k3::Shape{3584, 3072}));
  EXPECT_EQ(t.at(l1 + "block_sparse_moe.shared_experts.up_proj.weight").shape, (k3::Shape{6144, 7168}));
  EXPECT_EQ(t.at(k3::layer_prefix(3) + "self_attn.kv_a_proj_with_mqa.weight").shape, (k3::Shape{576, 7168}));
  EXPECT_EQ(t.at(k3::layer_prefix(92) + "self_attn.q_b_proj.weight").shape, (k3::Shape{96 * 192, 1536}));
  EXPECT_EQ(t.at(k3::layer_prefix(90) + "self_attn.dt_bias").shape, (k3::Shape{12288}));
}

TEST(ParamSpecs, StoredTensorsMxfp4Layout) {
  k3::K3Config c = load("kimi-k3.json");
  // mxfp4.json holds real bytes of this K3 matrix: packed_cols 1792, scale_cols 112.
  k3::test::Fixture fx("mxfp4.json");
  const std::string w1 = fx.json().at("source").get<std::string>() + ".weight";
  const k3::ParamSpec* spec = nullptr;
  auto specs = k3::k3_param_specs(c);
  for (const auto& s : specs)
    if (s.name == w1) spec = &s;
  ASSERT_NE(spec, nullptr) << w1;
  auto st = k3::stored_tensors(*spec, k3::ExpertStorage::Mxfp4);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].name, w1 + "_packed");
  EXPECT_EQ(st[0].dtype, k3::DType::U8);
  EXPECT_EQ(st[0].shape, (k3::Shape{3072, fx.json().at("packed_cols").get<int64_t>()}));
  EXPECT_EQ(st[1].name, w1 + "_scale");
  EXPECT_EQ(st[1].shape, (k3::Shape{3072, fx.json().at("scale_cols").get<int64_t>()}));
  EXPECT_EQ(k3::mxfp4_weight_name(st[0].name), w1);
  EXPECT_EQ(k3::mxfp4_weight_name(st[1].name), w1);
  auto plain = k3::stored_tensors(*spec, k3::ExpertStorage::Plain, k3::DType::F32);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].name, w1);
  EXPECT_EQ(plain[0].nbytes(), uint64_t(3072) * 3584 * 4);
  // Non-expert tensors stay plain even under MXFP4 storage.
  auto emb = k3::stored_tensors(specs.front(), k3::ExpertStorage::Mxfp4);
  ASSERT_EQ(emb.size(), 1u);
  EXPECT_EQ(emb[0].dtype, k3::DType::BF16);
  // Tiny: w2 is [64, 48] and 48 is not a multiple of 32.
  k3::K3Config tiny = load("tiny.json");
  for (const auto& s : k3::k3_param_specs(tiny)) {
    if (s.name == k3::layer_prefix(1) + "block_sparse_moe.experts.0.w2.weight") {
      EXPECT_THROW(k3::stored_tensors(s, k3::ExpertStorage::Mxfp4), k3::Error);
    }
    if (s.name == k3::layer_prefix(1) + "block_sparse_moe.experts.0.w1.weight") {
      EXPECT_EQ(k3::stored_tensors(s, k3::ExpertStorage::Mxfp4)[0].shape, (k3::Shape{48, 32}));
    }
  }
}

TEST(ParamSpecs, RoutedExpertNameHelpers) {
  const std::string p = k3::layer_prefix(4) + "block_sparse_moe.";
  EXPECT_TRUE(k3::is_routed_expert_weight(p + "experts.12.w3.weight"));
  EXPECT_FALSE(k3::is_routed_expert_weight(p + "experts.12.w3.weight_packed"));
  EXPECT_FALSE(k3::is_routed_expert_weight(p + "experts.12.w4.weight"));
  EXPECT_FALSE(k3::is_routed_expert_weight(p + "experts.x.w1.weight"));
  EXPECT_FALSE(k3::is_routed_expert_weight(p + "shared_experts.gate_proj.weight"));
  EXPECT_FALSE(k3::is_routed_expert_weight(p + "gate.weight"));
  EXPECT_EQ(k3::mxfp4_weight_name(p + "experts.3.w2.weight_scale"), p + "experts.3.w2.weight");
  EXPECT_EQ(k3::mxfp4_weight_name(p + "gate.weight_scale"), "");
  EXPECT_EQ(k3::mxfp4_weight_name(p + "experts.3.w2.weight"), "");
  EXPECT_STREQ(k3::component_name(k3::Component::RoutedExperts), "routed_experts");
  EXPECT_STREQ(k3::component_name(k3::Component::AttnRes), "attn_res");
}

TEST(ParamSpecs, ComponentOfNameWithoutConfig) {
  for (const char* f : {"tiny.json", "small-896.json"}) {
    k3::K3Config cfg = load(f);
    for (const auto& s : k3::k3_param_specs(cfg)) {
      const bool mla = s.layer >= 0 && cfg.is_mla_layer(s.layer);
      k3::Component c;
      ASSERT_TRUE(k3::component_of_name(s.name, mla, &c)) << s.name;
      EXPECT_EQ(c, s.component) << s.name;
      if (s.component == k3::Component::RoutedExperts) {
        ASSERT_TRUE(k3::component_of_name(k3::mxfp4_scale_name(s.name), mla, &c)) << s.name;
        EXPECT_EQ(c, k3::Component::RoutedExperts);
      }
    }
  }
  k3::Component c;
  // Shared names resolve by layer kind; mixer-only names exist for one kind only.
  ASSERT_TRUE(k3::component_of_name(k3::layer_prefix(3) + "self_attn.o_proj.weight", true, &c));
  EXPECT_EQ(c, k3::Component::MLA);
  ASSERT_TRUE(k3::component_of_name(k3::layer_prefix(3) + "self_attn.o_proj.weight", false, &c));
  EXPECT_EQ(c, k3::Component::KDA);
  EXPECT_FALSE(k3::component_of_name(k3::layer_prefix(3) + "self_attn.q_a_proj.weight", false, &c));
  EXPECT_FALSE(k3::component_of_name(k3::layer_prefix(3) + "self_attn.A_log", true, &c));
  EXPECT_FALSE(k3::component_of_name(k3::layer_prefix(2) + "foo.weight", false, &c));
  EXPECT_FALSE(k3::component_of_name("model.embed_tokens.weight", false, &c));
  EXPECT_FALSE(k3::component_of_name(k3::layer_prefix(2) + "block_sparse_moe.gate.weight_scale", false, &c));
}
