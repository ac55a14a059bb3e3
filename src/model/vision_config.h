// The MoonViT-V2 encoder's dimensions, its parameter table and its token counts, resolved from
// `vision_config` (docs/model.md section 11; field names and released defaults as in the
// released config.json: 27 layers, width 1024, 12 heads, qkv width 1536, MLP 4096, patch 14,
// a 64 x 64 position table, 2 x 2 merge, projector into the text width).
// An image of H x W pixels is padded (bottom/right) up to multiples of patch * merge, cut into
// a (H'/p) x (W'/p) patch grid, and after the merge gives (H'/(p kh)) (W'/(p kw)) tokens:
// 224 x 224 at patch 14 gives 16 x 16 patches and 64 tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"

namespace k3 {

struct VisionDims {
  int64_t layers = 27, width = 1024, heads = 12, qkv = 1536, mlp = 4096, patch = 14;
  int64_t pos_h = 64, pos_w = 64;  // learned position table [pos_h, pos_w, width]
  int64_t merge_h = 2, merge_w = 2;
  int64_t text_width = 7168;       // projector output = the text model's hidden_size
  double block_norm_eps = 1.1920928955078125e-07;  // nn.RMSNorm(dim) default: float32 epsilon
  double post_norm_eps = 1e-5;     // projector_ln_eps
  double rope_theta = 10000.0;

  int64_t head_dim() const { return qkv / heads; }
  int64_t merged_width() const { return width * merge_h * merge_w; }  // projector input, 4 D
  int64_t patch_values() const { return 3 * patch * patch; }          // one patch row
};

// Released defaults for absent sizes; text_width = cfg.hidden_size. k3::Error naming `source`
// and the field when the config has no vision_config, the head dim is not a multiple of 4
// (the 2D rotary pairs), mm_hidden_size differs from vt_hidden_size, or a size is impossible.
VisionDims resolve_vision_dims(const K3Config& cfg, const std::string& source);

// One image's patch grid and token count.
struct ImageGrid {
  int64_t h = 0, w = 0;  // patches (multiples of merge_h / merge_w)
  int64_t patches() const { return h * w; }
};
// The grid of an image of `height` x `width` pixels (padded up to multiples of patch * merge).
ImageGrid image_grid(const VisionDims& d, int64_t height, int64_t width);
// Tokens the image contributes to the text stream: (h / merge_h) (w / merge_w).
int64_t image_token_count(const VisionDims& d, const ImageGrid& g);

// The encoder's parameter table in one fixed order, released names and shapes ([out, in]):
// vision_tower.patch_embed.proj.weight [D, 3, p, p], vision_tower.patch_embed.pos_emb.weight
// [ph, pw, D], per block norm0/norm1 [D], wqkv [3 Q, D], wo [D, Q], mlp.fc0 [I, D], mlp.fc1
// [D, I]; vision_tower.encoder.final_layernorm.weight [D]; mm_projector.proj.0.weight
// [4D, 4D], mm_projector.proj.2.weight [text, 4D], mm_projector.post_norm.weight [text].
struct VisionParamSpec {
  std::string name;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
};
std::vector<VisionParamSpec> vision_param_specs(const VisionDims& d);

// Offsets of each spec in one flat buffer (table order, no padding), as llm.c carves its
// parameters: the weights, their gradients and the optimiser moments share this layout.
struct VisionLayout {
  std::vector<VisionParamSpec> specs;
  std::vector<int64_t> offsets;
  int64_t total = 0;
  explicit VisionLayout(const VisionDims& d);
  VisionLayout() = default;
  int64_t offset_of(const std::string& name) const;  // K3_ASSERT when absent
};

}  // namespace k3
