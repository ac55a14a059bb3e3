// The MoonViT-V2 vision encoder and its projector (docs/model.md section 11), forward and
// backward on one packed batch of images, templated on the scalar type (float for training
// and inference, double for the gradient checks). The wiring only: the ops are in
// kernels/vision_ops.h, kernels/segment_attention.h, kernels/norm.h and kernels/gemm.h.
//   x      = patches W_patch^T + interp(pos_table, grid)           [L, D]   (L = all patches)
//   block  : x += wo(attn(rope2d(wqkv(rmsnorm0(x)))))              (block-diagonal per image)
//            x += fc1(gelu_tanh(fc0(rmsnorm1(x))))
//   enc    = rmsnorm_final(x)
//   m      = merge_kh_kw(enc) per image                            [N, 4 D] (N = image tokens)
//   out    = post_norm(proj2(gelu(proj0(m))))                      [N, text width]
// The parameters live in one flat buffer carved by VisionLayout (model/vision_config.h); the
// gradients use the same layout and accumulate (+=).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/vision_config.h"

namespace k3 {

// Images packed into one sequence: patch rows in image order, each image's grid row-major.
template <typename T>
struct VisionBatch {
  std::vector<ImageGrid> grids;
  std::vector<T> patches;  // [L, 3 p p], channel-major inside a patch (Conv2d weight order)
  int64_t patch_count() const;
  int64_t token_count(const VisionDims& d) const;
  std::vector<int64_t> patch_offsets() const;  // cu [n + 1]
};

// Appends an image given as rgb [3, height, width] in [0, 1]: normalised to [-1, 1]
// ((v - 0.5) / 0.5), padded with 0 at the bottom and right up to the grid of image_grid().
template <typename T>
void append_image(VisionBatch<T>& batch, const VisionDims& d, const float* rgb, int64_t height, int64_t width);

// What the backward needs, saved by the forward (one entry per block).
template <typename T>
struct VisionActs {
  struct Block {
    std::vector<T> xin, rstd0, xn0, qkv, att, h, rstd1, xn1, f0, g;
  };
  std::vector<Block> blocks;
  std::vector<T> xf, rstd_f, enc, merged, y1, g1, y2, rstd_p;
  std::vector<T> cs, sn;        // rotary cos / sin [L, hd / 2]
  std::vector<int64_t> cu;      // patch segment boundaries
  std::vector<int64_t> tok_cu;  // image token boundaries
};

// out [N, text width] (assigned). `acts` may be null (inference: nothing kept).
template <typename T>
void vision_forward(T* out, VisionActs<T>* acts, const T* params, const VisionLayout& layout, const VisionDims& d,
                    const VisionBatch<T>& batch);

// dparams += dL/dparams for dout = dL/dout [N, text width], from the saved activations.
template <typename T>
void vision_backward(T* dparams, const T* dout, const VisionActs<T>& acts, const T* params, const VisionLayout& layout,
                     const VisionDims& d, const VisionBatch<T>& batch);

// The encoder's parameters read from a checkpoint under their released names, converted to
// f32 into `params` (layout.total floats). Every tensor must be present with the table's
// shape: k3::Error naming the file, the tensor, the expected and the actual shape otherwise.
void load_vision_params(float* params, const VisionLayout& layout, const CheckpointReader& ck);

// A model directory's encoder for inference: its dims (config.json's vision_config), the
// parameters (every vision_tower.* / mm_projector.* tensor, shapes checked) and the media
// placeholder id. k3::Error naming config.json when it has no vision_config or no
// media_placeholder_token_id, or naming the tensor when one is missing or mis-shaped.
struct VisionModel {
  VisionDims dims;
  VisionLayout layout;
  std::vector<float> params;
  int32_t media_id = -1;
};
VisionModel load_vision_model(const std::string& dir, const K3Config& cfg, const std::string& config_path);

// Random initialisation (normal, std 0.02 for matrices; std 1 for the position table as the
// reference's nn.init.normal_; norm gains 1), deterministic in `seed`.
void init_vision_params(float* params, const VisionLayout& layout, uint64_t seed);

}  // namespace k3
