// Config parsing and validation: the three accepted layouts, the fixture configs that must
// be refused (cfg/*.json) with the offending field named, file/JSON/type errors, and the
// HF round trip (docs/model.md section 1).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "core/error.h"
#include "io/config.h"

using nlohmann::json;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The message of the k3::Error thrown by `fn`; fails the test if nothing is thrown.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const k3::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a k3::Error";
  return "";
}

json manifest_config() { return k3::test::Fixture("ops/MANIFEST.json").json().at("config"); }

// The manifest config rewritten into the HF nested form.
json as_hf(const json& flat) {
  json tc = flat;
  json lac = {{"num_heads", tc["kda_num_heads"]},
              {"head_dim", tc["kda_head_dim"]},
              {"short_conv_kernel_size", tc["short_conv_kernel_size"]},
              {"gate_lower_bound", tc["gate_lower_bound"]},
              {"full_attn_layers", tc["full_attn_layers"]}};
  for (const char* k : {"kda_num_heads", "kda_head_dim", "short_conv_kernel_size", "gate_lower_bound", "full_attn_layers"})
    tc.erase(k);
  tc["linear_attn_config"] = lac;
  tc["activation_situ_beta"] = tc["situ_beta"];
  tc["activation_situ_linear_beta"] = tc["situ_linear_beta"];
  tc.erase("situ_beta");
  tc.erase("situ_linear_beta");
  return json{{"model_type", "kimi_k3"}, {"text_config", tc}};
}

void expect_tiny(const k3::K3Config& c) {
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 13);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.kda_num_heads, 4);
  EXPECT_EQ(c.kda_head_dim, 16);
  EXPECT_EQ(c.short_conv_kernel_size, 4);
  EXPECT_TRUE(c.has_gate_lower_bound);
  EXPECT_EQ(c.gate_lower_bound, -5.0);
  EXPECT_EQ(c.full_attn_layers, (std::vector<int64_t>{4, 8, 12, 13}));
  EXPECT_EQ(c.kda_layers, (std::vector<int64_t>{1, 2, 3, 5, 6, 7, 9, 10, 11}));
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 24);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 16);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_token, 2);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.routed_expert_hidden_size, 64);
  EXPECT_EQ(c.moe_intermediate_size, 48);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.attn_res_block_size, 3);
  EXPECT_EQ(c.situ_beta, 4.0);
  EXPECT_EQ(c.situ_linear_beta, 25.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.is_mla_layer(3));    // layer 4 (1-based)
  EXPECT_TRUE(c.is_mla_layer(12));   // layer 13
  EXPECT_FALSE(c.is_mla_layer(0));
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
}

}  // namespace

TEST(Config, ManifestFlatFormParses) {
  expect_tiny(k3::parse_config(manifest_config().dump(), "MANIFEST.json"));
}

TEST(Config, HfNestedAndBareTextConfigParse) {
  json hf = as_hf(manifest_config());
  expect_tiny(k3::parse_config(hf.dump(), "hf.json"));
  expect_tiny(k3::parse_config(hf["text_config"].dump(), "bare.json"));
}

TEST(Config, ShippedTinyConfigMatchesFixture) {
  k3::K3Config c = k3::load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  expect_tiny(c);
}

TEST(Config, ShippedK3ConfigHasReleasedValues) {
  k3::K3Config c = k3::load_config(std::string(K3_SOURCE_DIR) + "/configs/kimi-k3.json");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 93);
  ASSERT_EQ(c.full_attn_layers.size(), 24u);
  EXPECT_EQ(c.full_attn_layers.front(), 4);
  EXPECT_EQ(c.full_attn_layers[22], 92);
  EXPECT_EQ(c.full_attn_layers.back(), 93);
  EXPECT_EQ(c.kda_layers.size(), 69u);
  EXPECT_EQ(c.num_experts, 896);
  EXPECT_EQ(c.num_experts_per_token, 16);
  EXPECT_EQ(c.routed_expert_hidden_size, 3584);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.intermediate_size, 33792);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.vocab_size, 163840);
  for (const char* f : {"small-896.json", "mid-1024.json"})
    EXPECT_NO_THROW(k3::load_config(std::string(K3_SOURCE_DIR) + "/configs/" + f)) << f;
}

TEST(Config, MissingGateLowerBoundMeansUnbounded) {
  json hf = as_hf(manifest_config());
  hf["text_config"]["linear_attn_config"]["gate_lower_bound"] = nullptr;
  EXPECT_FALSE(k3::parse_config(hf.dump(), "x.json").has_gate_lower_bound);
  hf["text_config"]["linear_attn_config"].erase("gate_lower_bound");
  EXPECT_FALSE(k3::parse_config(hf.dump(), "x.json").has_gate_lower_bound);
}

TEST(Config, FixtureBadLayerIndexRefused) {
  std::string path = k3::test::fixture_path("cfg/bad_layer_index.json");
  std::string msg = error_of([&] { k3::load_config(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("full_attn_layers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("999"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1..13"), std::string::npos) << msg;
}

TEST(Config, FixtureBadTopkRefused) {
  std::string path = k3::test::fixture_path("cfg/bad_topk.json");
  std::string msg = error_of([&] { k3::load_config(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("num_experts_per_token"), std::string::npos) << msg;
  EXPECT_NE(msg.find("128"), std::string::npos) << msg;
}

TEST(Config, FixtureNoLayerMapRefused) {
  std::string path = k3::test::fixture_path("cfg/no_layermap.json");
  std::string msg = error_of([&] { k3::load_config(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("full_attn_layers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(Config, MissingFileNamesTheFile) {
  std::string msg = error_of([] { k3::load_config("/nonexistent/dir/config.json"); });
  EXPECT_NE(msg.find("/nonexistent/dir/config.json"), std::string::npos) << msg;
}

TEST(Config, InvalidJsonNamesTheFile) {
  std::string msg = error_of([] { k3::parse_config("{\"hidden_size\": 128,", "broken.json"); });
  EXPECT_NE(msg.find("broken.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
  msg = error_of([] { k3::parse_config("[1, 2]", "array.json"); });
  EXPECT_NE(msg.find("array.json"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesTheField) {
  json hf = as_hf(manifest_config());
  hf["text_config"]["hidden_size"] = "128";
  std::string msg = error_of([&] { k3::parse_config(hf.dump(), "t.json"); });
  EXPECT_NE(msg.find("t.json: text_config.hidden_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;

  hf = as_hf(manifest_config());
  hf["text_config"]["linear_attn_config"]["num_heads"] = 4.5;
  msg = error_of([&] { k3::parse_config(hf.dump(), "t.json"); });
  EXPECT_NE(msg.find("text_config.linear_attn_config.num_heads"), std::string::npos) << msg;

  hf = as_hf(manifest_config());
  hf["text_config"]["rms_norm_eps"] = "small";
  msg = error_of([&] { k3::parse_config(hf.dump(), "t.json"); });
  EXPECT_NE(msg.find("text_config.rms_norm_eps"), std::string::npos) << msg;

  hf = as_hf(manifest_config());
  hf["text_config"]["moe_renormalize"] = 1;
  msg = error_of([&] { k3::parse_config(hf.dump(), "t.json"); });
  EXPECT_NE(msg.find("text_config.moe_renormalize"), std::string::npos) << msg;

  hf = as_hf(manifest_config());
  hf["text_config"]["linear_attn_config"]["full_attn_layers"] = json::array({4, "8"});
  msg = error_of([&] { k3::parse_config(hf.dump(), "t.json"); });
  EXPECT_NE(msg.find("text_config.linear_attn_config.full_attn_layers"), std::string::npos) << msg;
}

TEST(Config, MissingRequiredFieldNamed) {
  json hf = as_hf(manifest_config());
  hf["text_config"].erase("num_experts");
  std::string msg = error_of([&] { k3::parse_config(hf.dump(), "t.json"); });
  EXPECT_NE(msg.find("text_config.num_experts: required field is missing"), std::string::npos) << msg;
}

// Each case: mutate the HF form, expect an error naming `field` (and `value` when given).
TEST(Config, RangeChecksNameFieldAndValue) {
  struct Case {
    const char* what;
    std::function<void(json&)> mutate;
    const char* field;
    const char* value;
  };
  const std::vector<Case> cases = {
      {"layer 0", [](json& t) { t["linear_attn_config"]["full_attn_layers"] = {0, 4}; }, "full_attn_layers", "layer 0"},
      {"duplicate", [](json& t) { t["linear_attn_config"]["full_attn_layers"] = {4, 8, 4}; }, "full_attn_layers", "layer 4"},
      {"both lists", [](json& t) {
         t["linear_attn_config"]["kda_layers"] = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11};
       }, "kda_layers", "layer 4"},
      {"uncovered", [](json& t) { t["linear_attn_config"]["kda_layers"] = {1, 2, 3, 5, 6, 7, 9, 10}; },
       "kda_layers", "layer 11"},
      {"kda out of range", [](json& t) {
         t["linear_attn_config"]["kda_layers"] = {1, 2, 3, 5, 6, 7, 9, 10, 11, 14};
       }, "kda_layers", "layer 14"},
      {"topk = E", [](json& t) { t["num_experts_per_token"] = 8; }, "num_experts_per_token", "8"},
      {"topk 0", [](json& t) { t["num_experts_per_token"] = 0; }, "num_experts_per_token", "0"},
      {"odd d", [](json& t) { t["hidden_size"] = 127; }, "hidden_size", "127"},
      {"zero dim", [](json& t) { t["q_lora_rank"] = 0; }, "q_lora_rank", "0"},
      {"negative heads", [](json& t) { t["linear_attn_config"]["num_heads"] = -1; }, "linear_attn_config.num_heads", "-1"},
      {"eps", [](json& t) { t["rms_norm_eps"] = 0.0; }, "rms_norm_eps", nullptr},
      {"glb >= 0", [](json& t) { t["linear_attn_config"]["gate_lower_bound"] = 0.5; }, "gate_lower_bound", nullptr},
      {"situ cap", [](json& t) { t["activation_situ_beta"] = 0.0; }, "activation_situ_beta", nullptr},
      {"situ linear cap", [](json& t) { t["activation_situ_linear_beta"] = -1.0; }, "activation_situ_linear_beta", nullptr},
      {"block size", [](json& t) { t["attn_res_block_size"] = 0; }, "attn_res_block_size", "0"},
      {"dense count", [](json& t) { t["first_k_dense_replace"] = 14; }, "first_k_dense_replace", "14"},
      {"dense width", [](json& t) { t["intermediate_size"] = 0; }, "intermediate_size", nullptr},
      {"dense width missing", [](json& t) { t.erase("intermediate_size"); }, "intermediate_size", "missing"},
  };
  for (const Case& k : cases) {
    json hf = as_hf(manifest_config());
    k.mutate(hf["text_config"]);
    std::string msg = error_of([&] { k3::parse_config(hf.dump(), "cfg.json"); });
    EXPECT_EQ(msg.rfind("cfg.json: text_config.", 0), 0u) << k.what << ": " << msg;
    EXPECT_NE(msg.find(k.field), std::string::npos) << k.what << ": " << msg;
    if (k.value) {
      EXPECT_NE(msg.find(k.value), std::string::npos) << k.what << ": " << msg;
    }
  }
}

TEST(Config, NoDenseLayersNeedsNoIntermediateSize) {
  json hf = as_hf(manifest_config());
  hf["text_config"]["first_k_dense_replace"] = 0;
  hf["text_config"].erase("intermediate_size");
  k3::K3Config c = k3::parse_config(hf.dump(), "x.json");
  EXPECT_TRUE(c.is_moe_layer(0));
}

TEST(Config, ValidateConfigRejectsBrokenStruct) {
  k3::K3Config c = k3::parse_config(manifest_config().dump(), "m.json");
  EXPECT_NO_THROW(k3::validate_config(c, "m"));
  c.num_experts_per_token = c.num_experts;
  std::string msg = error_of([&] { k3::validate_config(c, "m"); });
  EXPECT_NE(msg.find("num_experts_per_token"), std::string::npos) << msg;
}

TEST(Config, HfRoundTrip) {
  for (const char* f : {"kimi-k3.json", "tiny.json", "small-896.json", "mid-1024.json"}) {
    std::string path = std::string(K3_SOURCE_DIR) + "/configs/" + f;
    k3::K3Config a = k3::load_config(path);
    std::string text = k3::config_to_hf_json(a);
    json j = json::parse(text);
    ASSERT_TRUE(j.contains("text_config")) << f;
    EXPECT_TRUE(j["text_config"].contains("linear_attn_config")) << f;
    k3::K3Config b = k3::parse_config(text, "roundtrip");
    EXPECT_EQ(k3::config_to_hf_json(b), text) << f;
    EXPECT_EQ(b.full_attn_layers, a.full_attn_layers) << f;
    EXPECT_EQ(b.kda_layers, a.kda_layers) << f;
    EXPECT_EQ(b.rms_norm_eps, a.rms_norm_eps) << f;
    EXPECT_EQ(b.gate_lower_bound, a.gate_lower_bound) << f;
    EXPECT_EQ(b.situ_linear_beta, a.situ_linear_beta) << f;
    EXPECT_EQ(b.intermediate_size, a.intermediate_size) << f;
  }
  // The shipped K3 file is itself in the canonical form config_to_hf_json writes.
  std::string k3path = std::string(K3_SOURCE_DIR) + "/configs/kimi-k3.json";
  EXPECT_EQ(json::parse(k3::config_to_hf_json(k3::load_config(k3path))), json::parse(slurp(k3path)));
  // Unbounded gate survives the round trip as null.
  k3::K3Config u = k3::parse_config(manifest_config().dump(), "m");
  u.has_gate_lower_bound = false;
  EXPECT_FALSE(k3::parse_config(k3::config_to_hf_json(u), "u").has_gate_lower_bound);
}

// The released config.json (tests/data/k3-release-tiny, tools/make_release_fixture.py): every
// top-level field, quantization_config and vision_config are read, checked and written back.
TEST(Config, ReleasedConfigRoundTrip) {
  const std::string path = k3::test::data_path("k3-release-tiny/config.json");
  k3::K3Config a = k3::load_config(path);
  EXPECT_EQ(a.model_type, "kimi_k3");
  EXPECT_TRUE(a.quantization.present);
  EXPECT_TRUE(a.vision.present);
  k3::K3Config b = k3::parse_config(k3::config_to_hf_json(a), "roundtrip");
  EXPECT_EQ(b.architectures, a.architectures);
  EXPECT_EQ(b.eos_token_id, a.eos_token_id);
  EXPECT_EQ(b.media_placeholder_token_id, a.media_placeholder_token_id);
  EXPECT_EQ(b.quantization.ignore, a.quantization.ignore);
  EXPECT_EQ(b.quantization.format, a.quantization.format);
  EXPECT_EQ(b.vision.num_hidden_layers, a.vision.num_hidden_layers);
  EXPECT_EQ(b.vision.merge_kernel_size, a.vision.merge_kernel_size);
  EXPECT_EQ(b.vision.mm_projector_type, "patchmergerv2");
  EXPECT_EQ(k3::config_to_hf_json(b), k3::config_to_hf_json(a));
  // The writer's block is the release's (what the fixture states).
  const json q = json::parse(slurp(path))["text_config"]["quantization_config"];
  EXPECT_EQ(q["ignore"], json(k3::release_mxfp4_quantization().ignore));
}

TEST(Config, ReleasedFieldsAreValidated) {
  const json base = json::parse(slurp(k3::test::data_path("k3-release-tiny/config.json")));
  struct Case {
    const char* what;
    std::function<void(json&)> mutate;
    const char* field;
    const char* detail;
  };
  const std::vector<Case> cases = {
      {"quant method", [](json& j) { j["text_config"]["quantization_config"]["quant_method"] = "gptq"; },
       "text_config.quantization_config.quant_method", "unsupported quantization method \"gptq\""},
      {"quant method missing", [](json& j) { j["text_config"]["quantization_config"].erase("quant_method"); },
       "text_config.quantization_config.quant_method", "missing"},
      {"format", [](json& j) { j["text_config"]["quantization_config"]["format"] = "nvfp4-pack-quantized"; },
       "text_config.quantization_config.format", "nvfp4-pack-quantized"},
      {"bits", [](json& j) { j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8; },
       "text_config.quantization_config.config_groups.group_0.weights.num_bits", "8"},
      {"group", [](json& j) { j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16; },
       "config_groups.group_0.weights.group_size", "16"},
      {"int type", [](json& j) { j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] = "int"; },
       "config_groups.group_0.weights.type", "\"int\""},
      {"status", [](json& j) { j["text_config"]["quantization_config"]["quantization_status"] = "frozen"; },
       "text_config.quantization_config.quantization_status", "frozen"},
      {"top-level quantization", [](json& j) { j["quantization_config"] = {{"quant_method", "bitsandbytes"}}; },
       "cfg.json: quantization_config.quant_method", "bitsandbytes"},
      {"model type", [](json& j) { j["model_type"] = "deepseek_v3"; }, "cfg.json: model_type", "deepseek_v3"},
      {"text model type", [](json& j) { j["text_config"]["model_type"] = "llama"; }, "text_config.model_type", "llama"},
      {"architectures", [](json& j) { j["architectures"] = "KimiK3ForConditionalGeneration"; }, "architectures", "array"},
      {"eos", [](json& j) { j["eos_token_id"] = 544; }, "cfg.json: eos_token_id", "outside the vocabulary 0..543"},
      {"eos twice", [](json& j) { j["text_config"]["eos_token_id"] = 1; }, "text_config.eos_token_id", "disagrees"},
      {"vision width", [](json& j) { j["vision_config"]["text_hidden_size"] = 32; }, "vision_config.text_hidden_size",
       "differs from text_config.hidden_size 64"},
      {"vision layers", [](json& j) { j["vision_config"].erase("vt_num_hidden_layers"); },
       "vision_config.vt_num_hidden_layers", "missing"},
      {"vision merge", [](json& j) { j["vision_config"]["merge_kernel_size"] = json::array({2}); }, "vision_config.merge_kernel_size",
       "two"},
      {"vision heads", [](json& j) { j["vision_config"]["vt_num_attention_heads"] = 3; }, "vision_config.qkv_hidden_size",
       "multiple"},
  };
  for (const Case& k : cases) {
    json j = base;
    k.mutate(j);
    const std::string msg = error_of([&] { k3::parse_config(j.dump(), "cfg.json"); });
    EXPECT_EQ(msg.rfind("cfg.json: ", 0), 0u) << k.what << ": " << msg;
    EXPECT_NE(msg.find(k.field), std::string::npos) << k.what << ": " << msg;
    EXPECT_NE(msg.find(k.detail), std::string::npos) << k.what << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << k.what << ": " << msg;
  }
  // Null quantization/vision blocks mean "none" (as Hugging Face writes absent sub-configs).
  json j = base;
  j["text_config"]["quantization_config"] = nullptr;
  j["vision_config"] = nullptr;
  const k3::K3Config c = k3::parse_config(j.dump(), "cfg.json");
  EXPECT_FALSE(c.quantization.present);
  EXPECT_FALSE(c.vision.present);
}
