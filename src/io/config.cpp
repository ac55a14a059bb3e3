// K3 config parsing and validation (K3_REFERENCE section 1). Three accepted layouts:
//  - Hugging Face: {"text_config": {..., "linear_attn_config": {num_heads, head_dim,
//    short_conv_kernel_size, gate_lower_bound, full_attn_layers, kda_layers},
//    "activation_situ_beta", "activation_situ_linear_beta"}};
//  - a bare text_config object (the same fields without the outer nesting);
//  - the flat fixture form (ops/MANIFEST.json "config": kda_num_heads, kda_head_dim,
//    situ_beta, situ_linear_beta, full_attn_layers at top level).
// Every message names the file and the field as it is spelled in that file
// ("text_config.linear_attn_config.full_attn_layers"), so the user can find it.
#include "io/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace k3 {

using json = nlohmann::json;

bool K3Config::is_mla_layer(int64_t layer0) const {
  return std::find(full_attn_layers.begin(), full_attn_layers.end(), layer0 + 1) != full_attn_layers.end();
}

namespace {

// Where each K3Config member was read from, for messages. Members never looked up keep
// their own name.
using FieldPaths = std::map<std::string, std::string>;

std::string path_of(const FieldPaths& paths, const std::string& member) {
  auto it = paths.find(member);
  return it == paths.end() ? member : it->second;
}

// Reads fields out of one JSON object whose position in the file is `prefix`
// ("text_config.", "" ...), recording where each member was found.
class Reader {
 public:
  Reader(const json& obj, std::string prefix, const std::string& source, FieldPaths& paths)
      : obj_(obj), prefix_(std::move(prefix)), source_(source), paths_(paths) {}

  bool has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  // Looks up the first present key among `keys`; records its path under `member`.
  const json* find(const std::string& member, std::initializer_list<const char*> keys) {
    for (const char* k : keys) {
      if (has(k)) {
        paths_[member] = prefix_ + k;
        return &obj_.at(k);
      }
    }
    paths_[member] = prefix_ + *keys.begin();
    return nullptr;
  }

  void integer(int64_t& out, const std::string& member, std::initializer_list<const char*> keys, bool required) {
    const json* v = find(member, keys);
    if (!v) {
      if (required) missing(member);
      return;
    }
    if (!v->is_number_integer()) wrong_type(member, "an integer", *v);
    out = v->get<int64_t>();
  }
  void number(double& out, const std::string& member, std::initializer_list<const char*> keys, bool required) {
    const json* v = find(member, keys);
    if (!v) {
      if (required) missing(member);
      return;
    }
    if (!v->is_number()) wrong_type(member, "a number", *v);
    out = v->get<double>();
    if (!std::isfinite(out)) fail_input(source_, paths_[member], "must be finite");
  }
  void boolean(bool& out, const std::string& member, std::initializer_list<const char*> keys) {
    const json* v = find(member, keys);
    if (!v) return;  // every boolean field is optional
    if (!v->is_boolean()) wrong_type(member, "true or false", *v);
    out = v->get<bool>();
  }
  bool int_list(std::vector<int64_t>& out, const std::string& member, std::initializer_list<const char*> keys) {
    const json* v = find(member, keys);
    if (!v) return false;
    if (!v->is_array()) wrong_type(member, "an array of layer numbers", *v);
    out.clear();
    for (const auto& e : *v) {
      if (!e.is_number_integer()) wrong_type(member, "an array of integers", e);
      out.push_back(e.get<int64_t>());
    }
    return true;
  }

  [[noreturn]] void missing(const std::string& member) {
    fail_input(source_, paths_[member], "required field is missing");
  }
  [[noreturn]] void wrong_type(const std::string& member, const char* expected, const json& got) {
    std::string shown = got.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    fail_input(source_, paths_[member], std::string("expected ") + expected + ", got " + got.type_name() + " " + shown);
  }

 private:
  const json& obj_;
  std::string prefix_;
  const std::string& source_;
  FieldPaths& paths_;
};

std::string list_str(int64_t v) { return std::to_string(v); }

void validate_impl(const K3Config& c, const std::string& src, const FieldPaths& p) {
  auto f = [&](const char* member) { return path_of(p, member); };
  auto positive = [&](int64_t v, const char* member) {
    if (v <= 0) fail_input(src, f(member), "must be positive, got " + std::to_string(v));
  };
  positive(c.hidden_size, "hidden_size");
  if (c.hidden_size % 2) fail_input(src, f("hidden_size"), "must be even, got " + std::to_string(c.hidden_size));
  positive(c.num_hidden_layers, "num_hidden_layers");
  positive(c.vocab_size, "vocab_size");
  positive(c.kda_num_heads, "kda_num_heads");
  positive(c.kda_head_dim, "kda_head_dim");
  positive(c.short_conv_kernel_size, "short_conv_kernel_size");
  positive(c.num_attention_heads, "num_attention_heads");
  positive(c.q_lora_rank, "q_lora_rank");
  positive(c.kv_lora_rank, "kv_lora_rank");
  positive(c.qk_nope_head_dim, "qk_nope_head_dim");
  positive(c.qk_rope_head_dim, "qk_rope_head_dim");
  positive(c.v_head_dim, "v_head_dim");
  positive(c.num_experts, "num_experts");
  positive(c.routed_expert_hidden_size, "routed_expert_hidden_size");
  positive(c.moe_intermediate_size, "moe_intermediate_size");
  if (c.num_shared_experts < 0)
    fail_input(src, f("num_shared_experts"), "must be >= 0, got " + std::to_string(c.num_shared_experts));
  // QB reads the (k+1)-th largest score (K3_REFERENCE section 6), so k < E strictly.
  if (c.num_experts_per_token <= 0 || c.num_experts_per_token >= c.num_experts)
    fail_input(src, f("num_experts_per_token"),
               "top-k " + std::to_string(c.num_experts_per_token) + " must satisfy 0 < k < num_experts (" +
                   std::to_string(c.num_experts) + ")");
  if (!(c.rms_norm_eps > 0)) fail_input(src, f("rms_norm_eps"), "must be > 0");
  if (c.has_gate_lower_bound && !(c.gate_lower_bound < 0))
    fail_input(src, f("gate_lower_bound"), "must be < 0 (a log-decay floor), got " + std::to_string(c.gate_lower_bound));
  if (!(c.situ_beta > 0)) fail_input(src, f("situ_beta"), "SiTU cap must be > 0");
  if (!(c.situ_linear_beta > 0)) fail_input(src, f("situ_linear_beta"), "SiTU cap must be > 0");
  if (!(c.routed_scaling_factor > 0)) fail_input(src, f("routed_scaling_factor"), "must be > 0");
  if (c.attn_res_block_size < 1)
    fail_input(src, f("attn_res_block_size"), "must be >= 1, got " + std::to_string(c.attn_res_block_size));
  if (c.first_k_dense_replace < 0 || c.first_k_dense_replace > c.num_hidden_layers)
    fail_input(src, f("first_k_dense_replace"),
               std::to_string(c.first_k_dense_replace) + " is outside 0.." + std::to_string(c.num_hidden_layers));
  if (c.first_k_dense_replace > 0 && c.intermediate_size <= 0)
    fail_input(src, f("intermediate_size"), "must be positive when first_k_dense_replace > 0");
  if (c.max_position_embeddings < 0) fail_input(src, f("max_position_embeddings"), "must be >= 0");

  // Layer lists: 1-based, each layer in exactly one of the two lists.
  const int64_t n = c.num_hidden_layers;
  std::vector<int> owner(size_t(n) + 1, 0);  // 0 none, 1 full_attn, 2 kda
  auto mark = [&](const std::vector<int64_t>& list, int who, const char* member) {
    for (int64_t v : list) {
      if (v < 1 || v > n) fail_input(src, f(member), "layer " + list_str(v) + " is outside 1.." + list_str(n));
      if (owner[size_t(v)] == who) fail_input(src, f(member), "layer " + list_str(v) + " is listed twice");
      if (owner[size_t(v)] != 0)
        fail_input(src, f(member), "layer " + list_str(v) + " is also in " + f("full_attn_layers"));
      owner[size_t(v)] = who;
    }
  };
  mark(c.full_attn_layers, 1, "full_attn_layers");
  mark(c.kda_layers, 2, "kda_layers");
  for (int64_t v = 1; v <= n; ++v)
    if (owner[size_t(v)] == 0)
      fail_input(src, f("kda_layers"), "layer " + list_str(v) + " is in neither " + f("full_attn_layers") + " nor kda_layers");
}

K3Config parse_json(const json& root, const std::string& src) {
  if (!root.is_object()) fail_input(src, "", "expected a JSON object at the top level");
  FieldPaths paths;
  const json* tc = &root;
  std::string prefix;
  if (root.contains("text_config")) {
    tc = &root.at("text_config");
    prefix = "text_config.";
    if (!tc->is_object()) fail_input(src, "text_config", std::string("expected an object, got ") + tc->type_name());
  }
  Reader r(*tc, prefix, src, paths);
  K3Config c;
  r.integer(c.hidden_size, "hidden_size", {"hidden_size"}, true);
  r.integer(c.num_hidden_layers, "num_hidden_layers", {"num_hidden_layers"}, true);
  r.integer(c.vocab_size, "vocab_size", {"vocab_size"}, true);
  r.number(c.rms_norm_eps, "rms_norm_eps", {"rms_norm_eps"}, true);
  r.boolean(c.tie_word_embeddings, "tie_word_embeddings", {"tie_word_embeddings"});

  // KDA: nested linear_attn_config (HF) or flat kda_* fields (fixtures).
  const json* lac = nullptr;
  if (r.has("linear_attn_config")) {
    lac = &tc->at("linear_attn_config");
    if (!lac->is_object())
      fail_input(src, prefix + "linear_attn_config", std::string("expected an object, got ") + lac->type_name());
  }
  bool has_kda_list = false;
  auto read_kda = [&](Reader& k, bool nested) {
    if (nested) {
      k.integer(c.kda_num_heads, "kda_num_heads", {"num_heads"}, true);
      k.integer(c.kda_head_dim, "kda_head_dim", {"head_dim"}, true);
    } else {
      k.integer(c.kda_num_heads, "kda_num_heads", {"kda_num_heads"}, true);
      k.integer(c.kda_head_dim, "kda_head_dim", {"kda_head_dim"}, true);
    }
    k.integer(c.short_conv_kernel_size, "short_conv_kernel_size", {"short_conv_kernel_size"}, false);
    // Missing or null: the unbounded Kimi Linear gate (K3_REFERENCE section 3).
    c.has_gate_lower_bound = false;
    if (k.find("gate_lower_bound", {"gate_lower_bound"})) {
      k.number(c.gate_lower_bound, "gate_lower_bound", {"gate_lower_bound"}, true);
      c.has_gate_lower_bound = true;
    }
    if (!k.int_list(c.full_attn_layers, "full_attn_layers", {"full_attn_layers"})) k.missing("full_attn_layers");
    has_kda_list = k.int_list(c.kda_layers, "kda_layers", {"kda_layers"});
  };
  if (lac) {
    Reader k(*lac, prefix + "linear_attn_config.", src, paths);
    read_kda(k, true);
  } else {
    read_kda(r, false);
  }

  r.integer(c.num_attention_heads, "num_attention_heads", {"num_attention_heads"}, true);
  r.integer(c.q_lora_rank, "q_lora_rank", {"q_lora_rank"}, true);
  r.integer(c.kv_lora_rank, "kv_lora_rank", {"kv_lora_rank"}, true);
  r.integer(c.qk_nope_head_dim, "qk_nope_head_dim", {"qk_nope_head_dim"}, true);
  r.integer(c.qk_rope_head_dim, "qk_rope_head_dim", {"qk_rope_head_dim"}, true);
  r.integer(c.v_head_dim, "v_head_dim", {"v_head_dim"}, true);
  r.boolean(c.mla_use_output_gate, "mla_use_output_gate", {"mla_use_output_gate"});

  r.integer(c.num_experts, "num_experts", {"num_experts"}, true);
  r.integer(c.num_experts_per_token, "num_experts_per_token", {"num_experts_per_token"}, true);
  r.integer(c.num_shared_experts, "num_shared_experts", {"num_shared_experts"}, true);
  r.integer(c.routed_expert_hidden_size, "routed_expert_hidden_size", {"routed_expert_hidden_size"}, true);
  r.integer(c.moe_intermediate_size, "moe_intermediate_size", {"moe_intermediate_size"}, true);
  r.number(c.routed_scaling_factor, "routed_scaling_factor", {"routed_scaling_factor"}, false);
  r.boolean(c.moe_renormalize, "moe_renormalize", {"moe_renormalize"});
  r.boolean(c.latent_moe_use_norm, "latent_moe_use_norm", {"latent_moe_use_norm"});
  r.integer(c.first_k_dense_replace, "first_k_dense_replace", {"first_k_dense_replace"}, true);
  r.integer(c.intermediate_size, "intermediate_size", {"intermediate_size"}, c.first_k_dense_replace > 0);

  r.integer(c.attn_res_block_size, "attn_res_block_size", {"attn_res_block_size"}, true);
  r.number(c.situ_beta, "situ_beta", {"activation_situ_beta", "situ_beta"}, true);
  r.number(c.situ_linear_beta, "situ_linear_beta", {"activation_situ_linear_beta", "situ_linear_beta"}, true);
  r.integer(c.max_position_embeddings, "max_position_embeddings", {"max_position_embeddings"}, false);

  if (!has_kda_list && c.num_hidden_layers > 0) {
    // Complement of full_attn_layers; out-of-range entries are reported by validation.
    std::set<int64_t> full(c.full_attn_layers.begin(), c.full_attn_layers.end());
    c.kda_layers.clear();
    for (int64_t v = 1; v <= c.num_hidden_layers; ++v)
      if (!full.count(v)) c.kda_layers.push_back(v);
  }
  validate_impl(c, src, paths);
  return c;
}

}  // namespace

void validate_config(const K3Config& c, const std::string& source) { validate_impl(c, source, {}); }

K3Config parse_config(const std::string& json_text, const std::string& source_name) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    fail_input(source_name, "", std::string("invalid JSON: ") + e.what());
  }
  return parse_json(root, source_name);
}

K3Config load_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail_system("cannot open config", path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail_system("cannot read config", path);
  return parse_config(ss.str(), path);
}

std::string config_to_hf_json(const K3Config& c) {
  json lac = {
      {"num_heads", c.kda_num_heads},
      {"head_dim", c.kda_head_dim},
      {"short_conv_kernel_size", c.short_conv_kernel_size},
      {"full_attn_layers", c.full_attn_layers},
      {"kda_layers", c.kda_layers},
  };
  lac["gate_lower_bound"] = c.has_gate_lower_bound ? json(c.gate_lower_bound) : json(nullptr);
  json tc = {
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"vocab_size", c.vocab_size},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"linear_attn_config", lac},
      {"num_attention_heads", c.num_attention_heads},
      {"q_lora_rank", c.q_lora_rank},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"mla_use_output_gate", c.mla_use_output_gate},
      {"num_experts", c.num_experts},
      {"num_experts_per_token", c.num_experts_per_token},
      {"num_shared_experts", c.num_shared_experts},
      {"routed_expert_hidden_size", c.routed_expert_hidden_size},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"routed_scaling_factor", c.routed_scaling_factor},
      {"moe_renormalize", c.moe_renormalize},
      {"latent_moe_use_norm", c.latent_moe_use_norm},
      {"first_k_dense_replace", c.first_k_dense_replace},
      {"intermediate_size", c.intermediate_size},
      {"attn_res_block_size", c.attn_res_block_size},
      {"activation_situ_beta", c.situ_beta},
      {"activation_situ_linear_beta", c.situ_linear_beta},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  json root = {{"model_type", "kimi_k3"}, {"text_config", tc}};
  return root.dump(2) + "\n";
}

}  // namespace k3
