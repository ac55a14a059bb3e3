// The parameter table (see param_specs.h). One function builds it from the config; shape
// conventions follow the released checkpoint and the fixtures named in the header.
#include "model/param_specs.h"

#include <map>

#include "core/error.h"

namespace k3 {

const char* component_name(Component c) {
  switch (c) {
    case Component::Embedding: return "embedding";
    case Component::LmHead: return "lm_head";
    case Component::FinalNorm: return "final_norm";
    case Component::KDA: return "kda";
    case Component::MLA: return "mla";
    case Component::DenseFFN: return "dense_ffn";
    case Component::RoutedExperts: return "routed_experts";
    case Component::SharedExperts: return "shared_experts";
    case Component::LatentProj: return "latent_proj";
    case Component::Router: return "router";
    case Component::Norm: return "norm";
    case Component::AttnRes: return "attn_res";
  }
  return "?";
}

std::string layer_prefix(int64_t layer0) { return kModelPrefix + "layers." + std::to_string(layer0) + "."; }

std::vector<ParamSpec> k3_param_specs(const K3Config& c) {
  const int64_t d = c.hidden_size, V = c.vocab_size;
  const int64_t H = c.kda_num_heads, D = c.kda_head_dim, HD = H * D, K = c.short_conv_kernel_size;
  const int64_t Hm = c.num_attention_heads, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const int64_t E = c.num_experts, l = c.routed_expert_hidden_size, F = c.moe_intermediate_size;
  const int64_t SF = c.num_shared_experts * F, I = c.intermediate_size;

  std::vector<ParamSpec> t;
  auto add = [&](std::string name, Shape shape, Component comp, int64_t layer, int64_t expert = -1) {
    t.push_back({std::move(name), std::move(shape), comp, layer, expert});
  };
  add(kModelPrefix + "embed_tokens.weight", {V, d}, Component::Embedding, -1);

  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i);
    add(p + "input_layernorm.weight", {d}, Component::Norm, i);
    add(p + "post_attention_layernorm.weight", {d}, Component::Norm, i);
    // Two AttnRes reads per layer (before the mixer and before the FFN), section 2.
    add(p + "self_attention_res_norm.weight", {d}, Component::AttnRes, i);
    add(p + "self_attention_res_proj.weight", {1, d}, Component::AttnRes, i);
    add(p + "mlp_res_norm.weight", {d}, Component::AttnRes, i);
    add(p + "mlp_res_proj.weight", {1, d}, Component::AttnRes, i);

    const std::string a = p + "self_attn.";
    if (c.is_mla_layer(i)) {
      // Gated MLA, section 4; shapes as ops/mla.json and layer_mla.json.
      add(a + "q_a_proj.weight", {c.q_lora_rank, d}, Component::MLA, i);
      add(a + "q_a_layernorm.weight", {c.q_lora_rank}, Component::MLA, i);
      add(a + "q_b_proj.weight", {Hm * qk, c.q_lora_rank}, Component::MLA, i);
      add(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, d}, Component::MLA, i);
      add(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, Component::MLA, i);
      add(a + "kv_b_proj.weight", {Hm * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, Component::MLA, i);
      add(a + "o_proj.weight", {d, Hm * c.v_head_dim}, Component::MLA, i);
      if (c.mla_use_output_gate) add(a + "g_proj.weight", {Hm * c.v_head_dim, d}, Component::MLA, i);
    } else {
      // KDA, section 3; shapes as ops/kda_layer8.json and layer_kda.json (A_log per head,
      // dt_bias per channel, full-rank output gate).
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) add(a + n + ".weight", {HD, d}, Component::KDA, i);
      for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"})
        add(a + n + ".weight", {HD, 1, K}, Component::KDA, i);
      add(a + "f_a_proj.weight", {D, d}, Component::KDA, i);
      add(a + "f_b_proj.weight", {HD, D}, Component::KDA, i);
      add(a + "b_proj.weight", {H, d}, Component::KDA, i);
      add(a + "g_proj.weight", {HD, d}, Component::KDA, i);
      add(a + "o_norm.weight", {D}, Component::KDA, i);
      add(a + "o_proj.weight", {d, HD}, Component::KDA, i);
      add(a + "A_log", {H}, Component::KDA, i);
      add(a + "dt_bias", {HD}, Component::KDA, i);
    }

    if (!c.is_moe_layer(i)) {
      add(p + "mlp.gate_proj.weight", {I, d}, Component::DenseFFN, i);
      add(p + "mlp.up_proj.weight", {I, d}, Component::DenseFFN, i);
      add(p + "mlp.down_proj.weight", {d, I}, Component::DenseFFN, i);
      continue;
    }
    // Stable LatentMoE, section 5; shapes as ops/moe.json (shared experts fused: S*F wide).
    const std::string m = p + "block_sparse_moe.";
    add(m + "gate.weight", {E, d}, Component::Router, i);
    add(m + "gate.e_score_correction_bias", {E}, Component::Router, i);
    add(m + "routed_expert_down_proj.weight", {l, d}, Component::LatentProj, i);
    add(m + "routed_expert_up_proj.weight", {d, l}, Component::LatentProj, i);
    if (c.latent_moe_use_norm) add(m + "routed_expert_norm.weight", {l}, Component::LatentProj, i);
    if (SF > 0) {
      add(m + "shared_experts.gate_proj.weight", {SF, d}, Component::SharedExperts, i);
      add(m + "shared_experts.up_proj.weight", {SF, d}, Component::SharedExperts, i);
      add(m + "shared_experts.down_proj.weight", {d, SF}, Component::SharedExperts, i);
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      add(x + "w1.weight", {F, l}, Component::RoutedExperts, i, e);  // gate
      add(x + "w3.weight", {F, l}, Component::RoutedExperts, i, e);  // up
      add(x + "w2.weight", {l, F}, Component::RoutedExperts, i, e);  // down
    }
  }

  add(kOutputAttnResNormName, {d}, Component::AttnRes, -1);
  add(kOutputAttnResProjName, {1, d}, Component::AttnRes, -1);
  add(kModelPrefix + "norm.weight", {d}, Component::FinalNorm, -1);
  if (!c.tie_word_embeddings) add(kLmHeadName, {V, d}, Component::LmHead, -1);
  return t;
}

std::string legacy_param_name(const std::string& name) {
  if (name == kOutputAttnResNormName) return kModelPrefix + "final_res_norm.weight";
  if (name == kOutputAttnResProjName) return kModelPrefix + "final_res_proj.weight";
  return "";
}

std::string released_param_name(const std::string& legacy_name) {
  for (const std::string* n : {&kOutputAttnResNormName, &kOutputAttnResProjName})
    if (legacy_param_name(*n) == legacy_name) return *n;
  return "";
}

bool is_vision_tensor_name(const std::string& name) {
  return name.rfind(kVisionTowerPrefix, 0) == 0 || name.rfind(kMmProjectorPrefix, 0) == 0;
}

bool is_routed_expert_weight(const std::string& name) {
  // "...block_sparse_moe.experts.<digits>.w<1|2|3>.weight"
  static const std::string key = "block_sparse_moe.experts.";
  auto pos = name.find(key);
  if (pos == std::string::npos) return false;
  size_t i = pos + key.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i) return false;
  const std::string rest = name.substr(j);
  return rest == ".w1.weight" || rest == ".w2.weight" || rest == ".w3.weight";
}

std::string mxfp4_packed_name(const std::string& weight_name) { return weight_name + "_packed"; }
std::string mxfp4_scale_name(const std::string& weight_name) { return weight_name + "_scale"; }

std::string mxfp4_weight_name(const std::string& stored_name) {
  for (const char* suffix : {"_packed", "_scale"}) {
    if (stored_name.ends_with(suffix)) {
      std::string base = stored_name.substr(0, stored_name.size() - std::string(suffix).size());
      if (is_routed_expert_weight(base)) return base;
    }
  }
  return "";
}

// "layers.12.x.experts.3.w1.weight_packed" -> "layers.#.x.experts.#.w1.weight".
static std::string name_pattern(const std::string& name) {
  std::string n = mxfp4_weight_name(name);
  if (n.empty()) n = name;
  std::string r;
  r.reserve(n.size());
  for (size_t i = 0; i < n.size();) {
    bool after_key = (r.size() >= 7 && r.compare(r.size() - 7, 7, "layers.") == 0) ||
                     (r.size() >= 8 && r.compare(r.size() - 8, 8, "experts.") == 0);
    if (after_key && n[i] >= '0' && n[i] <= '9') {
      while (i < n.size() && n[i] >= '0' && n[i] <= '9') ++i;
      r += '#';
    } else {
      r += n[i++];
    }
  }
  return r;
}

bool component_of_name(const std::string& name, bool mla_layer, Component* out) {
  // Two layers cover every tensor kind: layer 1 KDA + dense FFN, layer 2 MLA + MoE with
  // shared experts and the latent norm; lm_head untied. Key: (pattern, is MLA layer);
  // everything but the mixer is entered under both kinds.
  static const std::map<std::pair<std::string, bool>, Component> patterns = [] {
    K3Config c;
    c.hidden_size = 2, c.num_hidden_layers = 2, c.vocab_size = 1;
    c.kda_num_heads = c.kda_head_dim = 1;
    c.full_attn_layers = {2}, c.kda_layers = {1};
    c.num_attention_heads = c.q_lora_rank = c.kv_lora_rank = 1;
    c.qk_nope_head_dim = c.qk_rope_head_dim = c.v_head_dim = 1;
    c.mla_use_output_gate = c.latent_moe_use_norm = true;
    c.tie_word_embeddings = false;
    c.num_experts = 2, c.num_experts_per_token = 1, c.num_shared_experts = 1;
    c.routed_expert_hidden_size = c.moe_intermediate_size = 1;
    c.first_k_dense_replace = 1, c.intermediate_size = 1;
    std::map<std::pair<std::string, bool>, Component> m;
    for (const ParamSpec& s : k3_param_specs(c)) {
      const std::string p = name_pattern(s.name);
      if (s.component == Component::KDA || s.component == Component::MLA) {
        m.emplace(std::make_pair(p, s.component == Component::MLA), s.component);
      } else {
        m.emplace(std::make_pair(p, false), s.component);
        m.emplace(std::make_pair(p, true), s.component);
      }
    }
    return m;
  }();
  auto it = patterns.find({name_pattern(name), mla_layer});
  if (it == patterns.end()) return false;
  *out = it->second;
  return true;
}

std::vector<StoredTensor> stored_tensors(const ParamSpec& spec, ExpertStorage storage, DType plain_dtype) {
  if (storage == ExpertStorage::Plain || spec.component != Component::RoutedExperts)
    return {{spec.name, plain_dtype, spec.shape}};
  K3_ASSERT(spec.shape.size() == 2, "routed expert spec is not a matrix: " + spec.name);
  const int64_t rows = spec.shape[0], cols = spec.shape[1];
  if (cols % 32 != 0)
    fail(spec.name + ": MXFP4 storage needs the input width to be a multiple of 32, logical shape is " +
         shape_str(spec.shape));
  return {{mxfp4_packed_name(spec.name), DType::U8, {rows, cols / 2}},
          {mxfp4_scale_name(spec.name), DType::U8, {rows, cols / 32}}};
}

}  // namespace k3
