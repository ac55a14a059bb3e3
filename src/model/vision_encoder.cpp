// The MoonViT-V2 encoder's forward and backward (see vision_encoder.h).
#include "model/vision_encoder.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/segment_attention.h"
#include "kernels/vision_ops.h"

namespace k3 {

namespace {

// Parameter offsets of one layout, looked up once.
struct Offsets {
  int64_t patch, pos, final_norm, proj0, proj2, post_norm;
  struct Block {
    int64_t norm0, wqkv, wo, norm1, fc0, fc1;
  };
  std::vector<Block> blocks;
  Offsets(const VisionLayout& L, const VisionDims& d) {
    patch = L.offset_of("vision_tower.patch_embed.proj.weight");
    pos = L.offset_of("vision_tower.patch_embed.pos_emb.weight");
    final_norm = L.offset_of("vision_tower.encoder.final_layernorm.weight");
    proj0 = L.offset_of("mm_projector.proj.0.weight");
    proj2 = L.offset_of("mm_projector.proj.2.weight");
    post_norm = L.offset_of("mm_projector.post_norm.weight");
    for (int64_t b = 0; b < d.layers; ++b) {
      const std::string bp = "vision_tower.encoder.blocks." + std::to_string(b) + ".";
      blocks.push_back({L.offset_of(bp + "norm0.weight"), L.offset_of(bp + "wqkv.weight"), L.offset_of(bp + "wo.weight"),
                        L.offset_of(bp + "norm1.weight"), L.offset_of(bp + "mlp.fc0.weight"),
                        L.offset_of(bp + "mlp.fc1.weight")});
    }
  }
};

template <typename T>
void rope_tables(std::vector<T>& cs, std::vector<T>& sn, const VisionDims& d, const std::vector<ImageGrid>& grids) {
  const int64_t hd = d.head_dim(), half = hd / 2;
  std::vector<double> ang(static_cast<size_t>(half));
  cs.clear(), sn.clear();
  for (const ImageGrid& g : grids)
    for (int64_t y = 0; y < g.h; ++y)
      for (int64_t x = 0; x < g.w; ++x) {
        rope2d_angles(ang.data(), y, x, hd, d.rope_theta);
        for (int64_t j = 0; j < half; ++j) cs.push_back(T(std::cos(double(ang[j])))), sn.push_back(T(std::sin(double(ang[j]))));
      }
}

template <typename T>
void add_into(std::vector<T>& dst, const std::vector<T>& src) {
  for (size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
}

}  // namespace

template <typename T>
int64_t VisionBatch<T>::patch_count() const {
  int64_t n = 0;
  for (const ImageGrid& g : grids) n += g.patches();
  return n;
}
template <typename T>
int64_t VisionBatch<T>::token_count(const VisionDims& d) const {
  int64_t n = 0;
  for (const ImageGrid& g : grids) n += image_token_count(d, g);
  return n;
}
template <typename T>
std::vector<int64_t> VisionBatch<T>::patch_offsets() const {
  std::vector<int64_t> cu = {0};
  for (const ImageGrid& g : grids) cu.push_back(cu.back() + g.patches());
  return cu;
}

template <typename T>
void append_image(VisionBatch<T>& batch, const VisionDims& d, const float* rgb, int64_t height, int64_t width) {
  const ImageGrid g = image_grid(d, height, width);
  const int64_t p = d.patch, P = d.patch_values();
  const size_t base = batch.patches.size();
  batch.patches.resize(base + size_t(g.patches() * P), T(0));
  for (int64_t py = 0; py < g.h; ++py)
    for (int64_t px = 0; px < g.w; ++px) {
      T* row = batch.patches.data() + base + size_t((py * g.w + px) * P);
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t ky = 0; ky < p; ++ky)
          for (int64_t kx = 0; kx < p; ++kx) {
            const int64_t y = py * p + ky, x = px * p + kx;
            if (y < height && x < width)
              row[(c * p + ky) * p + kx] = T((rgb[(c * height + y) * width + x] - 0.5f) / 0.5f);
          }
    }
  batch.grids.push_back(g);
}

template <typename T>
void vision_forward(T* out, VisionActs<T>* acts, const T* W, const VisionLayout& layout, const VisionDims& d,
                    const VisionBatch<T>& batch) {
  const Offsets o(layout, d);
  const int64_t L = batch.patch_count(), D = d.width, Q = d.qkv, I = d.mlp, hd = d.head_dim(), M = d.merged_width(),
                Tw = d.text_width, N = batch.token_count(d);
  K3_ASSERT(int64_t(batch.patches.size()) == L * d.patch_values());
  VisionActs<T> local;
  VisionActs<T>& A = acts ? *acts : local;
  A.cu = batch.patch_offsets();
  A.tok_cu = {0};
  for (const ImageGrid& g : batch.grids) A.tok_cu.push_back(A.tok_cu.back() + image_token_count(d, g));
  rope_tables(A.cs, A.sn, d, batch.grids);

  // x = patches W_patch^T + the position table resampled to each image's grid.
  std::vector<T> x(size_t(L * D)), pos;
  linear(x.data(), batch.patches.data(), W + o.patch, L, d.patch_values(), D);
  for (size_t i = 0; i < batch.grids.size(); ++i) {
    const ImageGrid& g = batch.grids[i];
    pos.resize(size_t(g.patches() * D));
    pos_interp_forward(pos.data(), W + o.pos, d.pos_h, d.pos_w, g.h, g.w, D);
    T* xi = x.data() + A.cu[i] * D;
    for (int64_t k = 0; k < g.patches() * D; ++k) xi[k] += pos[size_t(k)];
  }

  const SegmentAttnDims ad{d.heads, hd, 3 * Q, 1.0 / std::sqrt(double(hd))};
  A.blocks.resize(size_t(d.layers));
  std::vector<T> tmp(size_t(L * D));
  for (int64_t b = 0; b < d.layers; ++b) {
    typename VisionActs<T>::Block& B = A.blocks[size_t(b)];
    const typename Offsets::Block& ob = o.blocks[size_t(b)];
    B.xin = x;
    B.rstd0.resize(size_t(L)), B.xn0.resize(size_t(L * D)), B.qkv.resize(size_t(L * 3 * Q)), B.att.resize(size_t(L * Q));
    rmsnorm_forward(B.xn0.data(), B.rstd0.data(), x.data(), W + ob.norm0, L, D, d.block_norm_eps);
    linear(B.qkv.data(), B.xn0.data(), W + ob.wqkv, L, D, 3 * Q);
    rope2d_apply(B.qkv.data(), 3 * Q, A.cs.data(), A.sn.data(), L, d.heads, hd, +1);      // q
    rope2d_apply(B.qkv.data() + Q, 3 * Q, A.cs.data(), A.sn.data(), L, d.heads, hd, +1);  // k
    segment_attention_forward(B.att.data(), B.qkv.data(), B.qkv.data() + Q, B.qkv.data() + 2 * Q, A.cu, ad);
    linear(x.data(), B.att.data(), W + ob.wo, L, Q, D, /*accumulate=*/true);
    B.h = x;
    B.rstd1.resize(size_t(L)), B.xn1.resize(size_t(L * D)), B.f0.resize(size_t(L * I)), B.g.resize(size_t(L * I));
    rmsnorm_forward(B.xn1.data(), B.rstd1.data(), x.data(), W + ob.norm1, L, D, d.block_norm_eps);
    linear(B.f0.data(), B.xn1.data(), W + ob.fc0, L, D, I);
    for (int64_t k = 0; k < L * I; ++k) B.g[size_t(k)] = gelu_tanh(B.f0[size_t(k)]);
    linear(x.data(), B.g.data(), W + ob.fc1, L, I, D, /*accumulate=*/true);
    if (!acts) B = {};  // inference keeps nothing
  }
  A.xf = x;
  A.rstd_f.resize(size_t(L)), A.enc.resize(size_t(L * D));
  rmsnorm_forward(A.enc.data(), A.rstd_f.data(), x.data(), W + o.final_norm, L, D, d.block_norm_eps);

  A.merged.resize(size_t(N * M));
  for (size_t i = 0; i < batch.grids.size(); ++i) {
    const ImageGrid& g = batch.grids[i];
    patch_merge_forward(A.merged.data() + A.tok_cu[i] * M, A.enc.data() + A.cu[i] * D, g.h, g.w, d.merge_h, d.merge_w, D);
  }
  A.y1.resize(size_t(N * M)), A.g1.resize(size_t(N * M)), A.y2.resize(size_t(N * Tw)), A.rstd_p.resize(size_t(N));
  linear(A.y1.data(), A.merged.data(), W + o.proj0, N, M, M);
  for (int64_t k = 0; k < N * M; ++k) A.g1[size_t(k)] = gelu_erf(A.y1[size_t(k)]);
  linear(A.y2.data(), A.g1.data(), W + o.proj2, N, M, Tw);
  rmsnorm_forward(out, A.rstd_p.data(), A.y2.data(), W + o.post_norm, N, Tw, d.post_norm_eps);
}

template <typename T>
void vision_backward(T* dW, const T* dout, const VisionActs<T>& A, const T* W, const VisionLayout& layout,
                     const VisionDims& d, const VisionBatch<T>& batch) {
  const Offsets o(layout, d);
  const int64_t L = batch.patch_count(), D = d.width, Q = d.qkv, I = d.mlp, hd = d.head_dim(), M = d.merged_width(),
                Tw = d.text_width, N = batch.token_count(d);
  K3_ASSERT(int64_t(A.blocks.size()) == d.layers && !A.blocks.empty() && !A.blocks[0].xin.empty());
  // out = post_norm(y2)
  std::vector<T> dy2(size_t(N * Tw)), dg1(size_t(N * M)), dm(size_t(N * M));
  rmsnorm_backward(dy2.data(), dW + o.post_norm, dout, A.y2.data(), W + o.post_norm, A.rstd_p.data(), N, Tw);
  // y2 = g1 proj2^T
  linear_backward(dg1.data(), dW + o.proj2, dy2.data(), A.g1.data(), W + o.proj2, N, M, Tw, false);
  // g1 = gelu(y1)
  for (int64_t k = 0; k < N * M; ++k) dg1[size_t(k)] *= gelu_erf_grad(A.y1[size_t(k)]);
  // y1 = merged proj0^T
  linear_backward(dm.data(), dW + o.proj0, dg1.data(), A.merged.data(), W + o.proj0, N, M, M, false);
  // merged = merge(enc)
  std::vector<T> denc(size_t(L * D)), dx(size_t(L * D));
  for (size_t i = 0; i < batch.grids.size(); ++i) {
    const ImageGrid& g = batch.grids[i];
    patch_merge_backward(denc.data() + A.cu[i] * D, dm.data() + A.tok_cu[i] * M, g.h, g.w, d.merge_h, d.merge_w, D);
  }
  // enc = rmsnorm_final(xf)
  rmsnorm_backward(dx.data(), dW + o.final_norm, denc.data(), A.xf.data(), W + o.final_norm, A.rstd_f.data(), L, D);

  const SegmentAttnDims ad{d.heads, hd, 3 * Q, 1.0 / std::sqrt(double(hd))};
  std::vector<T> dg(size_t(L * I)), dxn(size_t(L * D)), datt(size_t(L * Q)), dqkv(size_t(L * 3 * Q)), dres(size_t(L * D));
  for (int64_t b = d.layers - 1; b >= 0; --b) {
    const typename VisionActs<T>::Block& B = A.blocks[size_t(b)];
    const typename Offsets::Block& ob = o.blocks[size_t(b)];
    // x_out = h + fc1(gelu_tanh(fc0(rmsnorm1(h)))): dx flows to h directly and through the MLP.
    linear_backward(dg.data(), dW + ob.fc1, dx.data(), B.g.data(), W + ob.fc1, L, I, D, false);
    for (int64_t k = 0; k < L * I; ++k) dg[size_t(k)] *= gelu_tanh_grad(B.f0[size_t(k)]);
    linear_backward(dxn.data(), dW + ob.fc0, dg.data(), B.xn1.data(), W + ob.fc0, L, D, I, false);
    rmsnorm_backward(dres.data(), dW + ob.norm1, dxn.data(), B.h.data(), W + ob.norm1, B.rstd1.data(), L, D);
    add_into(dx, dres);  // dx is now dL/dh
    // h = xin + wo(attn(rope(wqkv(rmsnorm0(xin)))))
    linear_backward(datt.data(), dW + ob.wo, dx.data(), B.att.data(), W + ob.wo, L, Q, D, false);
    segment_attention_backward(dqkv.data(), dqkv.data() + Q, dqkv.data() + 2 * Q, datt.data(), B.qkv.data(),
                               B.qkv.data() + Q, B.qkv.data() + 2 * Q, A.cu, ad);
    rope2d_apply(dqkv.data(), 3 * Q, A.cs.data(), A.sn.data(), L, d.heads, hd, -1);
    rope2d_apply(dqkv.data() + Q, 3 * Q, A.cs.data(), A.sn.data(), L, d.heads, hd, -1);
    linear_backward(dxn.data(), dW + ob.wqkv, dqkv.data(), B.xn0.data(), W + ob.wqkv, L, D, 3 * Q, false);
    rmsnorm_backward(dres.data(), dW + ob.norm0, dxn.data(), B.xin.data(), W + ob.norm0, B.rstd0.data(), L, D);
    add_into(dx, dres);  // dL/dxin
  }
  // x = patches W_patch^T + interp(pos)
  gemm(true, false, D, d.patch_values(), L, T(1), dx.data(), D, batch.patches.data(), d.patch_values(), T(1),
       dW + o.patch, d.patch_values());
  for (size_t i = 0; i < batch.grids.size(); ++i) {
    const ImageGrid& g = batch.grids[i];
    pos_interp_backward(dW + o.pos, dx.data() + A.cu[i] * D, d.pos_h, d.pos_w, g.h, g.w, D);
  }
}

void load_vision_params(float* params, const VisionLayout& layout, const CheckpointReader& ck) {
  for (size_t i = 0; i < layout.specs.size(); ++i) {
    const VisionParamSpec& s = layout.specs[i];
    if (!ck.has(s.name))
      fail_input(ck.path(), s.name, "missing (the config has a vision_config; expected shape " + shape_str(s.shape) + ")");
    const TensorInfo& ti = ck.info(s.name);
    if (ti.shape != s.shape)
      fail_input(ti.file, s.name, "shape " + shape_str(ti.shape) + ", expected " + shape_str(s.shape));
    if (ti.dtype != DType::F32 && ti.dtype != DType::BF16 && ti.dtype != DType::F16)
      fail_input(ti.file, s.name, std::string("dtype ") + dtype_name(ti.dtype) + ", expected f32, bf16 or f16");
    const Tensor t = ck.get(s.name).to_f32();
    std::copy_n(t.data<float>(), s.numel(), params + layout.offsets[i]);
  }
}

VisionModel load_vision_model(const std::string& dir, const K3Config& cfg, const std::string& config_path) {
  if (!cfg.vision.present) fail_input(config_path, "vision_config", "missing: this model has no vision encoder");
  if (cfg.media_placeholder_token_id < 0)
    fail_input(config_path, "media_placeholder_token_id", "missing: images need the <|media_pad|> id");
  VisionModel vm;
  vm.dims = resolve_vision_dims(cfg, config_path);
  vm.layout = VisionLayout(vm.dims);
  vm.params.resize(size_t(vm.layout.total));
  vm.media_id = int32_t(cfg.media_placeholder_token_id);
  load_vision_params(vm.params.data(), vm.layout, CheckpointReader::open(dir));
  return vm;
}

void init_vision_params(float* params, const VisionLayout& layout, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < layout.specs.size(); ++i) {
    const VisionParamSpec& s = layout.specs[i];
    float* p = params + layout.offsets[i];
    const bool gain = s.shape.size() == 1;  // norm weights
    const bool table = s.name.find("pos_emb") != std::string::npos;
    std::normal_distribution<float> nd(0.0f, table ? 1.0f : 0.02f);
    for (int64_t k = 0; k < s.numel(); ++k) p[k] = gain ? 1.0f : nd(rng);
  }
}

#define K3_INSTANTIATE(T)                                                                                          \
  template struct VisionBatch<T>;                                                                                  \
  template void append_image<T>(VisionBatch<T>&, const VisionDims&, const float*, int64_t, int64_t);               \
  template void vision_forward<T>(T*, VisionActs<T>*, const T*, const VisionLayout&, const VisionDims&,            \
                                  const VisionBatch<T>&);                                                          \
  template void vision_backward<T>(T*, const T*, const VisionActs<T>&, const T*, const VisionLayout&,              \
                                   const VisionDims&, const VisionBatch<T>&);
K3_INSTANTIATE(float)
K3_INSTANTIATE(double)
#undef K3_INSTANTIATE

}  // namespace k3
