// K3 model configuration: parsed from a Hugging Face config.json (nested `text_config`
// with `linear_attn_config`) or from the flat form used by the fixtures
// (tests/data/k3-fixtures/ops/MANIFEST.json "config"). docs/model.md section 1.
// The released config.json also carries, and this parser checks: top-level `model_type`
// "kimi_k3", `architectures`, the special token ids, `text_config.quantization_config`
// (compressed-tensors mxfp4-pack-quantized, for the routed experts) and `vision_config`
// (the MoonViT encoder's fields, model/vision_config.h).
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

  // Released top-level fields. model_type "" for a bare text_config or the flat form.
  std::string model_type;
  std::vector<std::string> architectures;
  // Special token ids (top level, else text_config); -1 when absent. Each < vocab_size.
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1, media_placeholder_token_id = -1;

  // `quantization_config` (compressed-tensors). Only MXFP4 weights (E2M1, one E8M0 scale
  // per 32) are accepted: any other method, format, bit width or group size is refused.
  struct Quantization {
    bool present = false;
    std::string quant_method;               // "compressed-tensors"
    std::string format;                     // "mxfp4-pack-quantized"
    int64_t num_bits = 4, group_size = 32;
    std::vector<std::string> ignore;        // module patterns kept unquantised ("re:.*self_attn.*")
  } quantization;

  // `vision_config` (MoonViT-V2, docs/model.md section 11). Integer sizes are 0 where the file
  // does not give them (model/vision_config.h resolves them to the released defaults); the
  // variant fields hold the released values unless the file says otherwise, and any other
  // variant (layernorm, biases, bicubic, another merge or projector) is refused when parsed.
  struct Vision {
    bool present = false;
    int64_t num_hidden_layers = 0;   // vt_num_hidden_layers
    int64_t hidden_size = 0;         // vt_hidden_size
    int64_t intermediate_size = 0;   // vt_intermediate_size
    int64_t num_attention_heads = 0; // vt_num_attention_heads
    int64_t qkv_hidden_size = 0;
    int64_t patch_size = 0;
    int64_t mm_hidden_size = 0;
    int64_t text_hidden_size = 0;    // must equal hidden_size
    std::vector<int64_t> merge_kernel_size;
    std::string mm_projector_type;
    int64_t init_pos_emb_height = 0, init_pos_emb_width = 0;  // learned position table (64 x 64)
    int64_t init_pos_emb_time = 0;                             // video frames (images use 1)
    double projector_ln_eps = 1e-5;                            // mm_projector.post_norm
    std::string norm_type = "rmsnorm", activation_func = "gelu_pytorch_tanh", projector_hidden_act = "gelu";
    std::string pos_emb_interpolation_mode = "bilinear", pos_emb_type = "divided_fixed";
    std::string merge_type = "sd2_tpool", mlp_type = "mlp2";
    bool attn_bias = false, linear_bias = false, patch_embed_proj_bias = false;
  } vision;

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
// Writes the released nested form (what `k3cpp init` puts beside a checkpoint): top-level
// architectures / model_type "kimi_k3" / token ids, text_config (model_type "kimi_linear",
// with quantization_config when `c.quantization.present`), vision_config when present.
std::string config_to_hf_json(const K3Config& c);
// The release's quantization_config block (MXFP4 routed experts, everything else bf16), as
// the released config.json states it.
K3Config::Quantization release_mxfp4_quantization();

}  // namespace k3
