// The weight store: every parameter of a K3 model in ONE 64-byte-aligned f32 buffer, carved
// by the parameter table (model/param_specs.h) in table order, so that a gradient buffer and
// optimizer moments allocated with the same ParamLayout line up element for element (the
// llm.c layout: one allocation, one table of {name, shape}, offsets derived from it).
// Routed experts may instead be held as MXFP4 (ExpertStorage::Mxfp4: inference only; the
// matrices then have no slot in the f32 buffer and live as Mxfp4Matrix, zero-copy views of
// the mmap'ed checkpoint when it stores them so). Training always uses Plain. Likewise, for
// inference, the dense matrices a checkpoint stores as bf16 may stay bf16 (bf16_held: no slot
// in the f32 buffer; zero-copy views of the mapped file), read through mat() by the kernels
// (kernels/weight_mat.h), so a decode step reads the bytes the checkpoint holds.
// Lookup by released name is one hash lookup; spec positions are stable table indices.
#pragma once
#include <functional>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "io/config.h"
#include "kernels/weight_mat.h"
#include "model/param_specs.h"

namespace k3 {

// Offsets (in floats) of each parameter in the f32 buffer. Every tensor starts on a 64-byte
// boundary (kParamAlign floats). With Mxfp4 experts the routed expert matrices get offset -1.
class ParamLayout {
 public:
  static constexpr int64_t kParamAlign = 16;  // floats = 64 bytes

  ParamLayout() = default;
  // bf16_held: by table position, the dense matrices held as bf16 (empty: none). streamed:
  // the decoder layers' dense matrices not held at all (a TrunkProvider supplies them,
  // model/trunk_provider.h; empty: none).
  ParamLayout(const K3Config& cfg, ExpertStorage experts, const std::vector<bool>& bf16_held = {},
              const std::vector<bool>& streamed = {});

  const std::vector<ParamSpec>& specs() const { return specs_; }
  size_t size() const { return specs_.size(); }
  const ParamSpec& spec(size_t i) const { return specs_.at(i); }
  int64_t offset(size_t i) const { return offsets_.at(i); }  // -1: not in the buffer
  bool in_buffer(size_t i) const { return offsets_.at(i) >= 0; }
  bool bf16_held(size_t i) const { return i < bf16_.size() && bf16_[i]; }
  bool streamed(size_t i) const { return i < streamed_.size() && streamed_[i]; }
  bool any_streamed() const;
  bool any_bf16() const;
  int64_t total_floats() const { return total_; }  // buffer length (multiple of kParamAlign)
  ExpertStorage experts() const { return experts_; }
  int64_t find(const std::string& name) const;  // table position, -1 if K3 has no such tensor
  size_t index(const std::string& name) const;  // k3::Error naming the tensor if absent
  // The buffer cut into L + 2 consecutive sections by the table order (L = num_layers): s[L + 3]
  // with [s[0], s[1]) the tensors before layer 0 (the embedding), [s[i + 1], s[i + 2]) layer
  // i's (its alignment padding included), [s[L + 1], s[L + 2]) those after the last layer (the
  // output AttnRes read, the final norm, the lm_head); s[0] = 0, s[L + 2] = total_floats(). A
  // section with nothing in the buffer is empty. A backward reports its progress in these.
  std::vector<int64_t> layer_sections(int64_t num_layers) const;

 private:
  std::vector<ParamSpec> specs_;
  std::vector<int64_t> offsets_;
  std::vector<bool> bf16_;
  std::vector<bool> streamed_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0;
  ExpertStorage experts_ = ExpertStorage::Plain;
};

class WeightStore {
 public:
  WeightStore() = default;
  // Zero-filled buffer (Tensor::zeros_mapped: pages never written take no memory); with Mxfp4 experts the MXFP4 slots start empty (set_mxfp4 fills them),
  // as do the bf16-held matrices (set_bf16).
  WeightStore(const K3Config& cfg, ExpertStorage experts, const std::vector<bool>& bf16_held = {},
              const std::vector<bool>& streamed = {});
  WeightStore(WeightStore&&) = default;
  WeightStore& operator=(WeightStore&&) = default;
  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  const K3Config& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  ExpertStorage expert_storage() const { return layout_.experts(); }

  // Expert parallelism at inference: gives the pages of the f32 routed experts that `keep`
  // rejects (by expert index) back to the system (madvise MADV_DONTNEED over the page-aligned
  // interior of each run of adjacent rejected experts); they read as zeros from then on, and
  // the kernels never read them (an ExpertExchange sends their rows to their owners). MXFP4
  // experts are views of the mapped file, whose unread pages take no memory: untouched.
  // Returns the bytes released.
  int64_t release_routed_experts(const std::function<bool(int64_t expert)>& keep);
  float* data() { return buffer_.data<float>(); }  // [layout().total_floats()]
  const float* data() const { return buffer_.data<float>(); }
  int64_t size() const { return layout_.total_floats(); }

  // The f32 parameter at table position i / with this released name (k3::Error if the name is
  // unknown; K3_ASSERT if it has no slot in the buffer, i.e. an MXFP4-held expert).
  float* param(size_t i);
  const float* param(size_t i) const;
  float* param(const std::string& name) { return param(layout_.index(name)); }
  const float* param(const std::string& name) const { return param(layout_.index(name)); }
  // A Tensor view [spec shape] of parameter i sharing the buffer (kept alive by the view).
  Tensor tensor(size_t i) const;

  // A weight matrix as held: the f32 slot, or the bf16 tensor (kernels/weight_mat.h); a
  // streamed matrix (layout().streamed(i)) is a null Mat.
  Mat mat(size_t i) const;
  Mat mat(const std::string& name) const { return mat(layout_.index(name)); }
  // bf16-held dense matrices (layout().bf16_held(i)).
  const Tensor& bf16(size_t i) const;
  void set_bf16(size_t i, Tensor t);  // K3_ASSERT on a dtype or shape that is not the spec's
  int64_t bf16_bytes() const;          // total bytes of the bf16-held matrices

  // MXFP4-held routed experts (expert_storage() == Mxfp4 only).
  bool has_mxfp4(size_t i) const { return i < mx_.size() && mx_[i].rows > 0; }
  const Mxfp4Matrix& mxfp4(size_t i) const;
  void set_mxfp4(size_t i, Mxfp4Matrix m);  // K3_ASSERT on a shape that is not the spec's
  // Memory-limited inference: the MXFP4 routed experts are not held at all (an ExpertProvider
  // supplies them, kernels/moe.h); the model's expert views then carry only their shapes.
  bool experts_external() const { return external_; }
  void set_experts_external() { external_ = true; }

 private:
  K3Config cfg_;
  ParamLayout layout_;
  Tensor buffer_;                // F32 [total_floats]
  std::vector<Mxfp4Matrix> mx_;  // by table position; filled only for MXFP4-held experts
  std::vector<Tensor> bf16_;     // by table position; filled only for bf16-held matrices
  bool external_ = false;        // routed experts supplied by a provider (experts_external)
};

// The tensors a trunk ring streams (model/trunk_provider.h): a decoder layer's dense matrices
// (rank 2, both sides >= 2, not routed experts); a layer's vectors, norms and conv taps stay
// held (they are < 1 % of its bytes).
bool is_streamable_layer_matrix(const ParamSpec& s);
// The embedding and the lm_head, which a HeadProvider streams (model/head_provider.h).
bool is_streamable_head_matrix(const ParamSpec& s);

}  // namespace k3
