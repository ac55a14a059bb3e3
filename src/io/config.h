// K3 model configuration: parsed from a Hugging Face config.json (nested `text_config`
// with `linear_attn_config`) or from the flat form used by the fixtures
// (tests/data/k3-fixtures/ops/MANIFEST.json "config"). K3_REFERENCE section 1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

struct K3Config {
  // Model width and stack.
  int64_t hidden_size = 0;           // d
  int64_t num_hidden_layers = 0;     // layers are 1-based in the layer lists, 0-based in code
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  // KDA (linear_attn_config).
  int64_t kda_num_heads = 0;
  int64_t kda_head_dim = 0;          // key and value head dim
  int64_t short_conv_kernel_size = 4;
  bool has_gate_lower_bound = true;  // false: unbounded Kimi Linear gate -exp(A_log)*softplus
  double gate_lower_bound = -5.0;
  std::vector<int64_t> full_attn_layers;  // 1-based MLA layers
  std::vector<int64_t> kda_layers;        // 1-based KDA layers (complement if not given)
  // MLA.
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0, kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool mla_use_output_gate = true;
  // MoE.
  int64_t num_experts = 0, num_experts_per_token = 0, num_shared_experts = 0;
  int64_t routed_expert_hidden_size = 0;  // latent width l
  int64_t moe_intermediate_size = 0;
  double routed_scaling_factor = 1.0;
  bool moe_renormalize = true;
  bool latent_moe_use_norm = true;
  int64_t first_k_dense_replace = 1;
  int64_t intermediate_size = 0;          // dense FFN width (layers < first_k_dense_replace)
  // Block Attention Residuals and SiTU-GLU.
  int64_t attn_res_block_size = 0;
  double situ_beta = 4.0, situ_linear_beta = 25.0;
  int64_t max_position_embeddings = 0;    // informational: no position encoding anywhere

  // Derived helpers (0-based layer index).
  bool is_mla_layer(int64_t layer0) const;
  bool is_moe_layer(int64_t layer0) const { return layer0 >= first_k_dense_replace; }
  int64_t mla_qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// Parses and validates; throws k3::Error "<path>: <field>: <problem>" on any problem.
K3Config load_config(const std::string& path);
K3Config parse_config(const std::string& json_text, const std::string& source_name);
// Validation alone (called by the parsers); `source` names the file in messages.
void validate_config(const K3Config& c, const std::string& source);
// Writes the Hugging Face nested form (what `k3cpp init` puts beside a checkpoint).
std::string config_to_hf_json(const K3Config& c);

}  // namespace k3
