// Weight store (see weights.h): offsets derived from the parameter table in table order.
#include "model/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace k3 {

bool is_streamable_layer_matrix(const ParamSpec& s) {
  return s.layer >= 0 && s.component != Component::RoutedExperts && s.shape.size() == 2 && s.shape[0] >= 2 &&
         s.shape[1] >= 2;
}

bool is_streamable_head_matrix(const ParamSpec& s) {
  return s.component == Component::Embedding || s.component == Component::LmHead;
}

ParamLayout::ParamLayout(const K3Config& cfg, ExpertStorage experts, const std::vector<bool>& held_as_bf16,
                         const std::vector<bool>& streamed)
    : specs_(k3_param_specs(cfg)), bf16_(held_as_bf16), streamed_(streamed), experts_(experts) {
  K3_ASSERT(bf16_.empty() || bf16_.size() == specs_.size(), "bf16_held has one entry per parameter");
  K3_ASSERT(streamed_.empty() || streamed_.size() == specs_.size(), "streamed has one entry per parameter");
  offsets_.resize(specs_.size());
  index_.reserve(specs_.size());
  int64_t off = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    K3_ASSERT(index_.emplace(s.name, i).second, "duplicate name in the parameter table: " + s.name);
    if (experts == ExpertStorage::Mxfp4 && s.component == Component::RoutedExperts) {
      offsets_[i] = -1;
      continue;
    }
    if (this->streamed(i)) {
      K3_ASSERT(is_streamable_layer_matrix(s) || is_streamable_head_matrix(s),
                "only a layer's dense matrices, the embedding and the lm_head can be streamed: " + s.name);
      offsets_[i] = -1;
      continue;
    }
    if (bf16_held(i)) {
      K3_ASSERT(s.shape.size() == 2 && s.component != Component::RoutedExperts,
                "only dense matrices can be held as bf16: " + s.name);
      offsets_[i] = -1;
      continue;
    }
    offsets_[i] = off;
    off += (s.numel() + kParamAlign - 1) / kParamAlign * kParamAlign;
  }
  total_ = off;
}

std::vector<int64_t> ParamLayout::layer_sections(int64_t L) const {
  // A section starts at its first tensor in the buffer; an empty one where the next starts.
  std::vector<int64_t> s(size_t(L + 3), -1);
  s[0] = 0, s[size_t(L + 2)] = total_;
  bool after_layers = false, in_tail = false;
  int64_t last = -1;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const int64_t layer = specs_[i].layer;
    K3_ASSERT(layer < L && (layer < 0 || (layer >= last && !in_tail)),
              "ParamLayout::layer_sections: the table is not in layer order at " + specs_[i].name);
    if (layer >= 0) after_layers = true, last = layer;
    else if (after_layers) in_tail = true;
    const size_t sec = layer >= 0 ? size_t(layer + 1) : in_tail ? size_t(L + 1) : 0;
    if (offsets_[i] >= 0 && s[sec] < 0) s[sec] = offsets_[i];
  }
  for (int64_t k = L + 1; k >= 1; --k)
    if (s[size_t(k)] < 0) s[size_t(k)] = s[size_t(k + 1)];
  for (int64_t k = 0; k <= L + 1; ++k) K3_ASSERT(s[size_t(k)] <= s[size_t(k + 1)], "ParamLayout::layer_sections: offsets");
  return s;
}

bool ParamLayout::any_streamed() const {
  for (bool b : streamed_)
    if (b) return true;
  return false;
}

bool ParamLayout::any_bf16() const {
  for (bool b : bf16_)
    if (b) return true;
  return false;
}

int64_t ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : int64_t(it->second);
}

size_t ParamLayout::index(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("tensor " + name + " is not a parameter of this K3 config");
  return it->second;
}

WeightStore::WeightStore(const K3Config& cfg, ExpertStorage experts, const std::vector<bool>& held_as_bf16,
                         const std::vector<bool>& streamed)
    : cfg_(cfg), layout_(cfg, experts, held_as_bf16, streamed), buffer_(Tensor::zeros_mapped(DType::F32, {layout_.total_floats()})) {
  if (experts == ExpertStorage::Mxfp4) mx_.resize(layout_.size());
  if (layout_.any_bf16()) bf16_.resize(layout_.size());
}

Mat WeightStore::mat(size_t i) const {
  if (layout_.streamed(i)) return Mat();
  if (layout_.bf16_held(i)) return Mat::from_bf16(bf16(i).data<uint16_t>());
  return Mat(param(i));
}

const Tensor& WeightStore::bf16(size_t i) const {
  K3_ASSERT(layout_.bf16_held(i) && i < bf16_.size() && bf16_[i].defined(),
            "no bf16 matrix held for " + layout_.spec(i).name);
  return bf16_[i];
}

void WeightStore::set_bf16(size_t i, Tensor t) {
  const ParamSpec& s = layout_.spec(i);
  K3_ASSERT(layout_.bf16_held(i) && t.dtype() == DType::BF16 && t.shape() == s.shape,
            "bf16 matrix does not match its parameter: " + s.name);
  bf16_[i] = std::move(t);
}

int64_t WeightStore::bf16_bytes() const {
  int64_t n = 0;
  for (const Tensor& t : bf16_)
    if (t.defined()) n += t.numel() * 2;
  return n;
}

float* WeightStore::param(size_t i) {
  K3_ASSERT(layout_.in_buffer(i), "parameter is held as MXFP4, not in the f32 buffer: " + layout_.spec(i).name);
  return data() + layout_.offset(i);
}

const float* WeightStore::param(size_t i) const {
  K3_ASSERT(layout_.in_buffer(i), "parameter is held as MXFP4, not in the f32 buffer: " + layout_.spec(i).name);
  return data() + layout_.offset(i);
}

Tensor WeightStore::tensor(size_t i) const {
  const ParamSpec& s = layout_.spec(i);
  K3_ASSERT(layout_.in_buffer(i), "parameter is held as MXFP4, not in the f32 buffer: " + s.name);
  const int64_t off = layout_.offset(i);
  return buffer_.slice0(off, off + s.numel()).reshape(s.shape);
}

const Mxfp4Matrix& WeightStore::mxfp4(size_t i) const {
  K3_ASSERT(has_mxfp4(i), "no MXFP4 matrix held for " + layout_.spec(i).name);
  return mx_[i];
}

void WeightStore::set_mxfp4(size_t i, Mxfp4Matrix m) {
  const ParamSpec& s = layout_.spec(i);
  K3_ASSERT(expert_storage() == ExpertStorage::Mxfp4 && s.component == Component::RoutedExperts,
            "MXFP4 slot for a tensor that is not an MXFP4-held routed expert: " + s.name);
  K3_ASSERT(m.rows == s.shape[0] && m.cols == s.shape[1], "MXFP4 matrix shape differs from the spec of " + s.name);
  mx_[i] = std::move(m);
}

int64_t WeightStore::release_routed_experts(const std::function<bool(int64_t expert)>& keep) {
  // Float ranges [begin, end) of the rejected experts' matrices, merged where only the layout's
  // alignment padding lies between them (every parameter starts at a multiple of kParamAlign).
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ParamSpec& s = layout_.spec(i);
    if (s.component != Component::RoutedExperts || !layout_.in_buffer(i) || keep(s.expert)) continue;
    runs.push_back({layout_.offset(i), layout_.offset(i) + s.numel()});
  }
  std::sort(runs.begin(), runs.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& r : runs)
    if (!merged.empty() && r.first <= (merged.back().second + ParamLayout::kParamAlign - 1) / ParamLayout::kParamAlign *
                                          ParamLayout::kParamAlign)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  char* base = reinterpret_cast<char*>(data());
  int64_t released = 0;
  for (const auto& [b, e] : merged) {
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(base + b * 4) + page - 1) / page * page;
    const uintptr_t hi = reinterpret_cast<uintptr_t>(base + e * 4) / page * page;
    if (hi <= lo) continue;
    if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0)
      fail_system("cannot release the memory of other ranks' experts (madvise)", "");
    released += int64_t(hi - lo);
  }
  return released;
}

}  // namespace k3
