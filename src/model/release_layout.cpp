// Reading the released K3 layout (see release_layout.h). Facts: the released config.json and
// tensor list (A_log F32 [128] per KDA layer, output_attn_res_*, vision_tower.* and
// mm_projector.* in their own trailing shards) as public K3 loaders and converters read them;
// docs/architecture.md "Tensor names" names those sources.
#include "model/release_layout.h"

#include <cstdio>
#include <set>

#include "core/error.h"

namespace k3 {

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

std::string stored_param_name(const CheckpointReader& ck, const std::string& spec_name) {
  if (ck.has(spec_name)) return spec_name;
  const std::string old = legacy_param_name(spec_name);
  return !old.empty() && ck.has(old) ? old : spec_name;
}

std::string legacy_names_notice(const CheckpointReader& ck, const std::vector<ParamSpec>& specs) {
  std::string olds, news;
  for (const ParamSpec& s : specs) {
    const std::string stored = stored_param_name(ck, s.name);
    if (stored == s.name) continue;
    olds += (olds.empty() ? "" : ", ") + stored.substr(kModelPrefix.size());
    news += (news.empty() ? "" : ", ") + s.name.substr(kModelPrefix.size());
  }
  if (olds.empty()) return "";
  return ck.path() + ": note: read " + olds + " (names k3cpp used before the release) as the released " + news +
         "; saving the model again writes the released names";
}

bool is_padded_a_log(const ParamSpec& spec, const Shape& stored) {
  return spec.name.ends_with(".A_log") && spec.shape.size() == 1 && stored.size() == 1 && stored[0] > spec.shape[0];
}

Tensor unpad_a_log(const CheckpointReader& ck, const std::string& stored_name, const ParamSpec& spec) {
  const TensorInfo& ti = ck.info(stored_name);
  const int64_t H = spec.shape[0], L = ti.shape[0];
  if (!is_float(ti.dtype))
    fail_input(ti.file, stored_name, std::string("dtype ") + dtype_name(ti.dtype) + ", expected f32, bf16 or f16");
  const Tensor t = ck.get(stored_name);
  // The release pads the per-head values with zeros; anything else there means the tensor is
  // not laid out as k3cpp reads it (e.g. one value per channel), so refuse rather than guess.
  const Tensor tail = t.slice0(H, L).to_f32();
  const float* p = tail.data<float>();
  for (int64_t j = 0; j < L - H; ++j)
    if (p[j] != 0.0f) {
      char v[32];
      std::snprintf(v, sizeof v, "%g", double(p[j]));
      fail_input(ti.file, stored_name,
                 "stored with " + std::to_string(L) + " entries for " + std::to_string(H) +
                     " KDA heads, but the padding after the first " + std::to_string(H) + " is not zero (entry " +
                     std::to_string(H + j) + " = " + v + ")");
    }
  return t.slice0(0, H);
}

VisionTensors check_vision_tensors(const CheckpointReader& ck, const K3Config& cfg) {
  VisionTensors vt;
  const K3Config::Vision& v = cfg.vision;
  std::set<int64_t> blocks;
  auto expect_shape = [&](const TensorInfo& ti, const Shape& want, const std::string& why) {
    if (ti.shape != want)
      fail_input(ti.file, ti.name, "shape " + shape_str(ti.shape) + ", expected " + shape_str(want) + " (" + why + ")");
  };
  const std::string bp = kVisionTowerPrefix + "encoder.blocks.";
  for (const std::string& n : ck.names()) {
    if (!is_vision_tensor_name(n)) continue;
    (n.starts_with(kVisionTowerPrefix) ? vt.tower : vt.projector) += 1;
    if (!v.present) continue;
    const TensorInfo& ti = ck.info(n);
    const int64_t Dv = v.hidden_size, I = v.intermediate_size, Q = v.qkv_hidden_size;
    const std::string vh = "vision_config.vt_hidden_size " + std::to_string(Dv);
    if (n.starts_with(bp)) {
      size_t j = bp.size();
      while (j < n.size() && n[j] >= '0' && n[j] <= '9') ++j;
      if (j == bp.size() || j - bp.size() > 9 || j >= n.size() || n[j] != '.')
        fail_input(ti.file, n, "not a vision block tensor name (expected " + bp + "<i>.*)");
      const int64_t b = std::stoll(n.substr(bp.size(), j - bp.size()));
      if (b >= v.num_hidden_layers)
        fail_input(ti.file, n, "block " + std::to_string(b) + " but vision_config.vt_num_hidden_layers is " +
                                   std::to_string(v.num_hidden_layers));
      blocks.insert(b);
      // MoonViT block names as released (norm0/norm1, wqkv/wo, mlp.fc0/fc1; no biases).
      const std::string rest = n.substr(j + 1);
      if (rest == "norm0.weight" || rest == "norm1.weight") expect_shape(ti, {Dv}, vh);
      if (Q > 0 && rest == "wqkv.weight") expect_shape(ti, {3 * Q, Dv}, "3 x qkv_hidden_size, " + vh);
      if (Q > 0 && rest == "wo.weight") expect_shape(ti, {Dv, Q}, vh + ", qkv_hidden_size");
      if (I > 0 && rest == "mlp.fc0.weight") expect_shape(ti, {I, Dv}, "vt_intermediate_size, " + vh);
      if (I > 0 && rest == "mlp.fc1.weight") expect_shape(ti, {Dv, I}, vh + ", vt_intermediate_size");
    } else if (n == kVisionTowerPrefix + "encoder.final_layernorm.weight") {
      expect_shape(ti, {Dv}, vh);
    } else if (n == kVisionTowerPrefix + "patch_embed.proj.weight" && v.patch_size > 0) {
      expect_shape(ti, {Dv, 3, v.patch_size, v.patch_size}, vh + ", 3 colours, patch_size");
    } else if (n == kMmProjectorPrefix + "proj.2.weight") {
      // The projector ends in the text width: its output rows feed the text embedding stream.
      if (ti.shape.size() != 2 || ti.shape[0] != cfg.hidden_size)
        fail_input(ti.file, n, "shape " + shape_str(ti.shape) + ", expected [" + std::to_string(cfg.hidden_size) +
                                   ", *] (the text hidden_size)");
    }
  }
  if (v.present && !blocks.empty())
    for (int64_t b = 0; b < v.num_hidden_layers; ++b)
      if (!blocks.count(b))
        fail_input(ck.path(), bp + std::to_string(b) + ".*",
                   "missing: vision_config.vt_num_hidden_layers is " + std::to_string(v.num_hidden_layers));
  const int64_t n = vt.tower + vt.projector;
  if (n > 0)
    vt.summary = ck.path() + ": skipped " + std::to_string(n) + " vision tensor(s) (" + kVisionTowerPrefix +
                 "*: " + std::to_string(vt.tower) + ", " + kMmProjectorPrefix + "*: " + std::to_string(vt.projector) +
                 (v.present ? ", checked against vision_config" : ", no vision_config to check them against") +
                 "): k3cpp loads the text model only";
  return vt;
}

}  // namespace k3
