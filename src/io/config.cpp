// K3 config parsing and validation (docs/model.md section 1). Three accepted layouts:
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
  // QB reads the (k+1)-th largest score (docs/model.md section 6), so k < E strictly.
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

// ---- released top-level fields, quantization_config, vision_config -------------------
// Field names and values as in the released config.json (moonshotai/Kimi-K3; checked
// against public K3 loaders that read it, see docs/architecture.md "Tensor names").

std::string shown(const json& v) {
  std::string t = v.dump();
  return t.size() > 40 ? t.substr(0, 37) + "..." : t;
}

std::string get_string(const json& obj, const std::string& key, const std::string& where, const std::string& src) {
  const json& v = obj.at(key);
  if (!v.is_string()) fail_input(src, where, std::string("expected a string, got ") + v.type_name() + " " + shown(v));
  return v.get<std::string>();
}

// An optional value that, when present and not null, must equal `want` (a JSON scalar).
void expect_value(const json& obj, const std::string& key, const json& want, const std::string& where,
                  const std::string& src, const char* why) {
  if (!obj.contains(key) || obj.at(key).is_null()) return;
  if (obj.at(key) != want)
    fail_input(src, where + key, shown(obj.at(key)) + " is not supported (expected " + want.dump() + ": " + why + ")");
}

void parse_quantization(const json& q, const std::string& where, const std::string& src, K3Config::Quantization& out) {
  if (!q.is_object()) fail_input(src, where, std::string("expected an object, got ") + q.type_name());
  const std::string w = where + ".";
  if (!q.contains("quant_method") || q.at("quant_method").is_null())
    fail_input(src, w + "quant_method", "required field is missing");
  out.quant_method = get_string(q, "quant_method", w + "quant_method", src);
  // Only the release's scheme: compressed-tensors packing of MXFP4 (docs/model.md section 8).
  if (out.quant_method != "compressed-tensors")
    fail_input(src, w + "quant_method",
               "unsupported quantization method \"" + out.quant_method +
                   "\" (k3cpp reads compressed-tensors mxfp4-pack-quantized checkpoints only)");
  if (!q.contains("format") || q.at("format").is_null()) fail_input(src, w + "format", "required field is missing");
  out.format = get_string(q, "format", w + "format", src);
  if (out.format != "mxfp4-pack-quantized")
    fail_input(src, w + "format", "unsupported compressed-tensors format \"" + out.format +
                                     "\" (k3cpp reads mxfp4-pack-quantized only)");
  // "compressed": the file holds the packed weights (weight_packed + weight_scale).
  expect_value(q, "quantization_status", "compressed", w, src, "the weights must be stored packed");
  if (!q.contains("config_groups") || !q.at("config_groups").is_object() || q.at("config_groups").empty())
    fail_input(src, w + "config_groups", "missing, empty or not an object");
  for (const auto& [gname, g] : q.at("config_groups").items()) {
    const std::string gw = w + "config_groups." + gname;
    if (!g.is_object()) fail_input(src, gw, std::string("expected an object, got ") + g.type_name());
    if (g.contains("format") && !g.at("format").is_null() && g.at("format") != "mxfp4-pack-quantized")
      fail_input(src, gw + ".format", shown(g.at("format")) + " is not supported (expected \"mxfp4-pack-quantized\")");
    if (g.contains("targets") && !g.at("targets").is_null()) {
      const json& t = g.at("targets");
      if (!t.is_array()) fail_input(src, gw + ".targets", std::string("expected an array, got ") + t.type_name());
      for (const json& e : t)
        if (!e.is_string()) fail_input(src, gw + ".targets", "expected an array of strings, got " + shown(t));
    }
    if (!g.contains("weights") || !g.at("weights").is_object())
      fail_input(src, gw + ".weights", "missing or not an object");
    const json& wt = g.at("weights");
    const std::string ww = gw + ".weights.";
    // MXFP4: 4-bit E2M1 floats, one shared uint8 (E8M0) scale per group of 32, symmetric.
    if (!wt.contains("num_bits") || wt.at("num_bits") != 4)
      fail_input(src, ww + "num_bits", (wt.contains("num_bits") ? shown(wt.at("num_bits")) : std::string("missing")) +
                                          ": MXFP4 weights have 4 bits");
    if (!wt.contains("group_size") || wt.at("group_size") != 32)
      fail_input(src, ww + "group_size",
                 (wt.contains("group_size") ? shown(wt.at("group_size")) : std::string("missing")) +
                     ": MXFP4 shares one scale per 32 weights");
    expect_value(wt, "type", "float", ww, src, "MXFP4 codes are E2M1 floats");
    expect_value(wt, "symmetric", true, ww, src, "MXFP4 has no zero point");
    expect_value(wt, "dynamic", false, ww, src, "the scales are stored");
    expect_value(wt, "strategy", "group", ww, src, "one scale per group of 32");
    expect_value(wt, "scale_dtype", "torch.uint8", ww, src, "E8M0 scales are stored as uint8");
  }
  out.ignore.clear();
  if (q.contains("ignore") && !q.at("ignore").is_null()) {
    const json& ig = q.at("ignore");
    if (!ig.is_array()) fail_input(src, w + "ignore", std::string("expected an array, got ") + ig.type_name());
    for (const json& e : ig) {
      if (!e.is_string()) fail_input(src, w + "ignore", "expected an array of strings, got " + shown(e));
      out.ignore.push_back(e.get<std::string>());
    }
  }
  out.num_bits = 4, out.group_size = 32;
  out.present = true;
}

void parse_vision(const json& v, const std::string& src, K3Config::Vision& out) {
  if (!v.is_object()) fail_input(src, "vision_config", std::string("expected an object, got ") + v.type_name());
  auto integer = [&](const char* key, int64_t& dst, bool required) {
    const std::string where = std::string("vision_config.") + key;
    if (!v.contains(key) || v.at(key).is_null()) {
      if (required) fail_input(src, where, "required field is missing");
      return;
    }
    const json& x = v.at(key);
    if (!x.is_number_integer()) fail_input(src, where, std::string("expected an integer, got ") + x.type_name() + " " + shown(x));
    dst = x.get<int64_t>();
    if (dst <= 0) fail_input(src, where, "must be positive, got " + std::to_string(dst));
  };
  // The layer count and width are what the skipped tensors are checked against.
  integer("vt_num_hidden_layers", out.num_hidden_layers, true);
  integer("vt_hidden_size", out.hidden_size, true);
  integer("vt_intermediate_size", out.intermediate_size, false);
  integer("vt_num_attention_heads", out.num_attention_heads, false);
  integer("qkv_hidden_size", out.qkv_hidden_size, false);
  integer("patch_size", out.patch_size, false);
  integer("mm_hidden_size", out.mm_hidden_size, false);
  integer("text_hidden_size", out.text_hidden_size, false);
  if (out.num_attention_heads > 0 && out.qkv_hidden_size > 0 && out.qkv_hidden_size % out.num_attention_heads != 0)
    fail_input(src, "vision_config.qkv_hidden_size",
               std::to_string(out.qkv_hidden_size) + " is not a multiple of vt_num_attention_heads (" +
                   std::to_string(out.num_attention_heads) + ")");
  if (v.contains("merge_kernel_size") && !v.at("merge_kernel_size").is_null()) {
    const json& m = v.at("merge_kernel_size");
    if (!m.is_array() || m.size() != 2)
      fail_input(src, "vision_config.merge_kernel_size", "expected two integers [h, w], got " + shown(m));
    for (const json& e : m) {
      if (!e.is_number_integer() || e.get<int64_t>() <= 0)
        fail_input(src, "vision_config.merge_kernel_size", "expected two positive integers, got " + shown(m));
      out.merge_kernel_size.push_back(e.get<int64_t>());
    }
  }
  if (v.contains("mm_projector_type") && !v.at("mm_projector_type").is_null())
    out.mm_projector_type = get_string(v, "mm_projector_type", "vision_config.mm_projector_type", src);
  if (!out.mm_projector_type.empty() && out.mm_projector_type != "patchmergerv2")
    fail_input(src, "vision_config.mm_projector_type",
               "\"" + out.mm_projector_type + "\" is not supported (K3's projector is \"patchmergerv2\")");
  integer("init_pos_emb_height", out.init_pos_emb_height, false);
  integer("init_pos_emb_width", out.init_pos_emb_width, false);
  integer("init_pos_emb_time", out.init_pos_emb_time, false);
  if (v.contains("projector_ln_eps") && !v.at("projector_ln_eps").is_null()) {
    const json& x = v.at("projector_ln_eps");
    if (!x.is_number() || !(x.get<double>() > 0))
      fail_input(src, "vision_config.projector_ln_eps", "expected a positive number, got " + shown(x));
    out.projector_ln_eps = x.get<double>();
  }
  // The variants K3 releases; the encoder (model/vision_encoder.h) implements these only.
  auto variant = [&](const char* key, std::string& dst, const char* why) {
    if (!v.contains(key) || v.at(key).is_null()) return;
    const std::string want = dst;
    dst = get_string(v, key, std::string("vision_config.") + key, src);
    if (dst != want)
      fail_input(src, std::string("vision_config.") + key,
                 "\"" + dst + "\" is not supported (k3cpp implements K3's \"" + want + "\": " + why + ")");
  };
  variant("norm_type", out.norm_type, "RMSNorm in every block");
  variant("activation_func", out.activation_func, "the blocks' MLP GELU, tanh form");
  variant("projector_hidden_act", out.projector_hidden_act, "the projector's exact GELU");
  variant("pos_emb_interpolation_mode", out.pos_emb_interpolation_mode, "the position table resampled bilinearly");
  variant("pos_emb_type", out.pos_emb_type, "a learned 2D table plus fixed sin/cos time");
  variant("merge_type", out.merge_type, "kh x kw spatial groups, time pooled");
  variant("mlp_type", out.mlp_type, "fc0, GELU, fc1");
  auto no_bias = [&](const char* key, bool& dst) {
    if (!v.contains(key) || v.at(key).is_null()) return;
    if (!v.at(key).is_boolean())
      fail_input(src, std::string("vision_config.") + key, "expected a boolean, got " + shown(v.at(key)));
    dst = v.at(key).get<bool>();
    if (dst) fail_input(src, std::string("vision_config.") + key, "true is not supported (K3's encoder has no biases)");
  };
  no_bias("attn_bias", out.attn_bias);
  no_bias("linear_bias", out.linear_bias);
  no_bias("patch_embed_proj_bias", out.patch_embed_proj_bias);
  out.present = true;
}

// Top-level model_type / architectures / token ids, quantization_config (text_config, where
// the release has it, or top level, where Hugging Face's loaded config repeats it) and
// vision_config. `tc` is the text config object at `prefix`.
void parse_release_fields(const json& root, const json& tc, const std::string& prefix, const std::string& src,
                          K3Config& c) {
  const bool nested = !prefix.empty();
  if (root.contains("model_type") && !root.at("model_type").is_null()) {
    c.model_type = get_string(root, "model_type", "model_type", src);
    // kimi_k3: the release's wrapper; kimi_linear: a bare text config (its predecessor's type).
    if (c.model_type != "kimi_k3" && c.model_type != "kimi_linear")
      fail_input(src, "model_type", "\"" + c.model_type + "\" is not a K3 model (expected \"kimi_k3\")");
  }
  if (nested && tc.contains("model_type") && !tc.at("model_type").is_null()) {
    const std::string t = get_string(tc, "model_type", prefix + "model_type", src);
    if (t != "kimi_linear" && t != "kimi_k3")
      fail_input(src, prefix + "model_type", "\"" + t + "\" is not K3's text model (expected \"kimi_linear\")");
  }
  if (root.contains("architectures") && !root.at("architectures").is_null()) {
    const json& a = root.at("architectures");
    if (!a.is_array() || a.empty())
      fail_input(src, "architectures", "expected a non-empty array of class names, got " + shown(a));
    for (const json& e : a) {
      if (!e.is_string() || e.get<std::string>().empty())
        fail_input(src, "architectures", "expected an array of class names, got " + shown(a));
      c.architectures.push_back(e.get<std::string>());
    }
  }
  auto token = [&](const char* key, int64_t& dst) {
    for (const auto& [obj, where] : {std::pair<const json*, std::string>{&root, ""}, {&tc, prefix}}) {
      if (!obj->contains(key) || obj->at(key).is_null()) continue;
      const json& x = obj->at(key);
      if (!x.is_number_integer())
        fail_input(src, where + key, std::string("expected an integer token id, got ") + x.type_name() + " " + shown(x));
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= c.vocab_size)
        fail_input(src, where + key, "token id " + std::to_string(id) + " is outside the vocabulary 0.." +
                                         std::to_string(c.vocab_size - 1));
      if (dst >= 0 && dst != id)
        fail_input(src, where + key, std::to_string(id) + " disagrees with the top-level " + key + " " + std::to_string(dst));
      dst = id;
    }
  };
  token("bos_token_id", c.bos_token_id);
  token("eos_token_id", c.eos_token_id);
  token("pad_token_id", c.pad_token_id);
  token("media_placeholder_token_id", c.media_placeholder_token_id);

  if (nested && tc.contains("quantization_config") && !tc.at("quantization_config").is_null())
    parse_quantization(tc.at("quantization_config"), prefix + "quantization_config", src, c.quantization);
  if (root.contains("quantization_config") && !root.at("quantization_config").is_null())
    parse_quantization(root.at("quantization_config"), "quantization_config", src, c.quantization);
  if (root.contains("vision_config") && !root.at("vision_config").is_null()) {
    parse_vision(root.at("vision_config"), src, c.vision);
    if (c.vision.text_hidden_size > 0 && c.vision.text_hidden_size != c.hidden_size)
      fail_input(src, "vision_config.text_hidden_size",
                 std::to_string(c.vision.text_hidden_size) + " differs from " + prefix + "hidden_size " +
                     std::to_string(c.hidden_size));
  }
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
    // Missing or null: the unbounded Kimi Linear gate (docs/model.md section 3).
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
  parse_release_fields(root, *tc, prefix, src, c);
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
  tc["model_type"] = "kimi_linear";
  if (c.quantization.present) {
    const K3Config::Quantization& q = c.quantization;
    tc["quantization_config"] = {
        {"config_groups",
         {{"group_0",
           {{"format", q.format},
            {"input_activations", nullptr},
            {"output_activations", nullptr},
            {"targets", {"Linear"}},
            {"weights",
             {{"dynamic", false}, {"group_size", q.group_size}, {"num_bits", q.num_bits},
              {"scale_dtype", "torch.uint8"}, {"strategy", "group"}, {"symmetric", true}, {"type", "float"}}}}}}},
        {"format", q.format},
        {"ignore", q.ignore},
        {"quant_method", q.quant_method},
        {"quantization_status", "compressed"},
    };
  }
  json root = {
      {"architectures", c.architectures.empty() ? std::vector<std::string>{"KimiK3ForConditionalGeneration"}
                                                : c.architectures},
      {"model_type", "kimi_k3"},
      {"text_config", tc},
      {"tie_word_embeddings", c.tie_word_embeddings},
  };
  for (const auto& [key, id] : {std::pair<const char*, int64_t>{"bos_token_id", c.bos_token_id},
                                {"eos_token_id", c.eos_token_id},
                                {"pad_token_id", c.pad_token_id},
                                {"media_placeholder_token_id", c.media_placeholder_token_id}})
    if (id >= 0) root[key] = id;
  if (c.vision.present) {
    const K3Config::Vision& v = c.vision;
    json vj = {{"vt_num_hidden_layers", v.num_hidden_layers}, {"vt_hidden_size", v.hidden_size}};
    for (const auto& [key, val] : {std::pair<const char*, int64_t>{"vt_intermediate_size", v.intermediate_size},
                                   {"vt_num_attention_heads", v.num_attention_heads},
                                   {"qkv_hidden_size", v.qkv_hidden_size},
                                   {"patch_size", v.patch_size},
                                   {"mm_hidden_size", v.mm_hidden_size},
                                   {"text_hidden_size", v.text_hidden_size}})
      if (val > 0) vj[key] = val;
    for (const auto& [key, val] : {std::pair<const char*, int64_t>{"init_pos_emb_height", v.init_pos_emb_height},
                                   {"init_pos_emb_width", v.init_pos_emb_width},
                                   {"init_pos_emb_time", v.init_pos_emb_time}})
      if (val > 0) vj[key] = val;
    if (!v.merge_kernel_size.empty()) vj["merge_kernel_size"] = v.merge_kernel_size;
    if (!v.mm_projector_type.empty()) vj["mm_projector_type"] = v.mm_projector_type;
    vj["projector_ln_eps"] = v.projector_ln_eps;
    vj["norm_type"] = v.norm_type, vj["activation_func"] = v.activation_func;
    vj["projector_hidden_act"] = v.projector_hidden_act;
    vj["pos_emb_interpolation_mode"] = v.pos_emb_interpolation_mode, vj["pos_emb_type"] = v.pos_emb_type;
    vj["merge_type"] = v.merge_type, vj["mlp_type"] = v.mlp_type;
    vj["attn_bias"] = false, vj["linear_bias"] = false, vj["patch_embed_proj_bias"] = false;
    root["vision_config"] = vj;
  }
  return root.dump(2) + "\n";
}

K3Config::Quantization release_mxfp4_quantization() {
  K3Config::Quantization q;
  q.present = true;
  q.quant_method = "compressed-tensors";
  q.format = "mxfp4-pack-quantized";
  // Everything but the routed experts stays bf16 (the released config.json's ignore list).
  q.ignore = {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
              "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"};
  return q;
}

}  // namespace k3
