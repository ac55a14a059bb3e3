// Resolving vision_config and the encoder's parameter table (see vision_config.h).
#include "model/vision_config.h"

#include "core/error.h"

namespace k3 {

VisionDims resolve_vision_dims(const K3Config& cfg, const std::string& source) {
  const K3Config::Vision& v = cfg.vision;
  if (!v.present) fail_input(source, "vision_config", "missing: the model has no vision encoder");
  VisionDims d;
  auto take = [](int64_t given, int64_t& dst) {
    if (given > 0) dst = given;
  };
  take(v.num_hidden_layers, d.layers);
  take(v.hidden_size, d.width);
  take(v.num_attention_heads, d.heads);
  // The reference encoder reads qkv_hidden_size "or" the width.
  d.qkv = v.qkv_hidden_size > 0 ? v.qkv_hidden_size : (v.hidden_size > 0 ? v.hidden_size : d.qkv);
  take(v.intermediate_size, d.mlp);
  take(v.patch_size, d.patch);
  take(v.init_pos_emb_height, d.pos_h);
  take(v.init_pos_emb_width, d.pos_w);
  if (v.merge_kernel_size.size() == 2) d.merge_h = v.merge_kernel_size[0], d.merge_w = v.merge_kernel_size[1];
  d.text_width = cfg.hidden_size;
  d.post_norm_eps = v.projector_ln_eps;
  if (d.qkv % d.heads != 0)
    fail_input(source, "vision_config.qkv_hidden_size",
               std::to_string(d.qkv) + " is not a multiple of vt_num_attention_heads " + std::to_string(d.heads));
  if (d.head_dim() % 4 != 0)
    fail_input(source, "vision_config.qkv_hidden_size",
               "head dim " + std::to_string(d.head_dim()) +
                   " is not a multiple of 4 (the 2D rotary embedding rotates column and row pairs)");
  if (v.mm_hidden_size > 0 && v.mm_hidden_size != d.width)
    fail_input(source, "vision_config.mm_hidden_size",
               std::to_string(v.mm_hidden_size) + " differs from vt_hidden_size " + std::to_string(d.width) +
                   " (the projector reads the encoder's merged output)");
  if (d.text_width <= 0) fail_input(source, "hidden_size", "the text width must be positive");
  return d;
}

ImageGrid image_grid(const VisionDims& d, int64_t height, int64_t width) {
  K3_ASSERT(height > 0 && width > 0);
  const int64_t uh = d.patch * d.merge_h, uw = d.patch * d.merge_w;
  ImageGrid g;
  g.h = (height + uh - 1) / uh * d.merge_h;
  g.w = (width + uw - 1) / uw * d.merge_w;
  return g;
}

int64_t image_token_count(const VisionDims& d, const ImageGrid& g) { return (g.h / d.merge_h) * (g.w / d.merge_w); }

std::vector<VisionParamSpec> vision_param_specs(const VisionDims& d) {
  const int64_t D = d.width, Q = d.qkv, I = d.mlp, p = d.patch, M = d.merged_width(), Tw = d.text_width;
  const std::string vt = "vision_tower.", mp = "mm_projector.";
  std::vector<VisionParamSpec> s = {
      {vt + "patch_embed.proj.weight", {D, 3, p, p}},
      {vt + "patch_embed.pos_emb.weight", {d.pos_h, d.pos_w, D}},
  };
  for (int64_t b = 0; b < d.layers; ++b) {
    const std::string bp = vt + "encoder.blocks." + std::to_string(b) + ".";
    s.push_back({bp + "norm0.weight", {D}});
    s.push_back({bp + "wqkv.weight", {3 * Q, D}});
    s.push_back({bp + "wo.weight", {D, Q}});
    s.push_back({bp + "norm1.weight", {D}});
    s.push_back({bp + "mlp.fc0.weight", {I, D}});
    s.push_back({bp + "mlp.fc1.weight", {D, I}});
  }
  s.push_back({vt + "encoder.final_layernorm.weight", {D}});
  s.push_back({mp + "proj.0.weight", {M, M}});
  s.push_back({mp + "proj.2.weight", {Tw, M}});
  s.push_back({mp + "post_norm.weight", {Tw}});
  return s;
}

VisionLayout::VisionLayout(const VisionDims& d) : specs(vision_param_specs(d)) {
  for (const VisionParamSpec& s : specs) offsets.push_back(total), total += s.numel();
}

int64_t VisionLayout::offset_of(const std::string& name) const {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name) return offsets[i];
  K3_ASSERT(!"vision parameter not in the table");
  return -1;
}

}  // namespace k3
