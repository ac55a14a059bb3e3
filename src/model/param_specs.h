// The single parameter table: every tensor of a K3 model with its released checkpoint name,
// logical (dequantised) shape, component and layer, derived from the config in one
// function. The planner, `k3cpp inspect`, the checkpoint loader and `k3cpp init` all read
// this table; nothing else spells tensor names or shapes. Layout and names follow the
// released checkpoint (docs/model.md sections 1-5) and were checked against the fixtures
// ops/layer_kda.json, layer_mla.json, moe.json, mla.json, kda_layer8.json.
// Shapes are PyTorch nn.Linear [out, in]. Dimension letters: d hidden, V vocab, H/D KDA
// heads/head dim, K conv kernel, Hm MLA heads, E experts, l latent width, F expert width,
// S shared experts, I dense FFN width.
// The output AttnRes read after the last layer is `output_attn_res_norm.weight` [d] and
// `output_attn_res_proj.weight` [1, d], as the release names it (its config.json/index as
// public K3 loaders read them); k3cpp wrote `final_res_norm`/`final_res_proj` before it
// knew that, and still reads those names (legacy_param_name).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/config.h"

namespace k3 {

enum class Component {
  Embedding, LmHead, FinalNorm, KDA, MLA, DenseFFN, RoutedExperts, SharedExperts, LatentProj,
  Router, Norm, AttnRes
};
inline constexpr int kNumComponents = 12;
const char* component_name(Component c);  // "embedding", "lm_head", ..., "attn_res"

struct ParamSpec {
  std::string name;     // full checkpoint name, e.g. "language_model.model.layers.3.self_attn.q_proj.weight"
  Shape shape;          // logical shape (MXFP4 experts: the dequantised [rows, cols])
  Component component;
  int64_t layer;        // 0-based decoder layer; -1 for global tensors
  int64_t expert;       // routed expert index; -1 otherwise
  int64_t numel() const { return shape_numel(shape); }
};

inline const std::string kModelPrefix = "language_model.model.";
inline const std::string kLmHeadName = "language_model.lm_head.weight";
inline const std::string kOutputAttnResNormName = kModelPrefix + "output_attn_res_norm.weight";
inline const std::string kOutputAttnResProjName = kModelPrefix + "output_attn_res_proj.weight";
// The release's vision tensors sit beside language_model.* (docs/model.md section 11); a
// text-only load skips them.
inline const std::string kVisionTowerPrefix = "vision_tower.";
inline const std::string kMmProjectorPrefix = "mm_projector.";

// "language_model.model.layers.{i}."
std::string layer_prefix(int64_t layer0);

// The whole table in a fixed order: embedding; per layer norms, AttnRes, mixer, FFN;
// final AttnRes read, final norm; lm_head (absent when tie_word_embeddings).
std::vector<ParamSpec> k3_param_specs(const K3Config& c);

// The name k3cpp used for a table tensor before it adopted the released name, "" if none:
// the output AttnRes read was `final_res_norm.weight` / `final_res_proj.weight`.
std::string legacy_param_name(const std::string& name);
// The inverse: the released name of a legacy name, "" if `legacy_name` is not one.
std::string released_param_name(const std::string& legacy_name);
// True for a `vision_tower.*` or `mm_projector.*` name.
bool is_vision_tensor_name(const std::string& name);

// True for a routed expert matrix name "...block_sparse_moe.experts.{e}.w{1,2,3}.weight".
bool is_routed_expert_weight(const std::string& name);
// For an MXFP4 part name ("...w1.weight_packed" / "...w1.weight_scale") the logical
// ".weight" name; "" for any other name.
std::string mxfp4_weight_name(const std::string& stored_name);

// MXFP4 stored names of a routed expert ".weight" name (docs/model.md sections 5 and 8).
std::string mxfp4_packed_name(const std::string& weight_name);  // "...w1.weight_packed"
std::string mxfp4_scale_name(const std::string& weight_name);   // "...w1.weight_scale"

// The component a checkpoint name belongs to, without a config (for listings): the name
// with its layer and expert indices and any MXFP4 suffix normalised is looked up in the
// table of a small config that has every kind of layer. KDA and MLA share some names
// (self_attn.o_proj, self_attn.g_proj), so the caller says which kind the layer is
// (`mla_layer`; ignored for global tensors). False if the name is not K3's for that kind.
bool component_of_name(const std::string& name, bool mla_layer, Component* out);

enum class ExpertStorage { Plain, Mxfp4 };

struct StoredTensor {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes() const { return uint64_t(shape_numel(shape)) * dtype_size(dtype); }
};

// On-disk tensors for one spec. Plain: the spec's name, `plain_dtype`, logical shape.
// Mxfp4 (routed experts only; other specs stay Plain): `weight_packed` U8 [rows, cols/2]
// and `weight_scale` U8 [rows, cols/32]; throws k3::Error naming the tensor if cols is not
// a multiple of 32.
std::vector<StoredTensor> stored_tensors(const ParamSpec& spec, ExpertStorage storage,
                                         DType plain_dtype = DType::BF16);

}  // namespace k3
