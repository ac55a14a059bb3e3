// Planner arithmetic (see planner.h for every formula). All parameter figures are sums over
// the parameter table; nothing here repeats a tensor shape.
#include "model/planner.h"

#include <cmath>

#include "core/error.h"

namespace k3 {

// All routed experts have the same shapes, so "the first k experts of each layer" is an
// exact stand-in for "any k of E" when counting active parameters.
static bool is_active(const ParamSpec& s, const K3Config& c) {
  if (s.component == Component::Embedding) return false;  // a lookup, not a matmul
  if (s.component == Component::RoutedExperts) return s.expert < c.num_experts_per_token;
  return true;
}

ParamCounts count_params(const K3Config& c) {
  ParamCounts r;
  for (const ParamSpec& s : k3_param_specs(c)) {
    ComponentCount& cc = r.by_component[size_t(s.component)];
    const int64_t n = s.numel();
    cc.tensors += 1;
    cc.total += n;
    if (is_active(s, c)) cc.active += n;
  }
  for (const ComponentCount& cc : r.by_component) {
    r.total += cc.total;
    r.active += cc.active;
    r.tensors += cc.tensors;
  }
  return r;
}

WeightStorage parse_weight_storage(const std::string& s) {
  if (s == "bf16") return WeightStorage::BF16;
  if (s == "mxfp4") return WeightStorage::MXFP4;
  fail("unknown weight storage '" + s + "' (expected bf16 or mxfp4)");
}

const char* weight_storage_name(WeightStorage s) { return s == WeightStorage::BF16 ? "bf16" : "mxfp4"; }

// Bytes of one tensor under the storage scheme. MXFP4 matrices: cols/2 packed bytes and
// cols/32 scale bytes per row (section 8); rounded up per row when cols is not a multiple
// of 32 (such a config cannot actually be stored in MXFP4; the estimate stays defined).
static uint64_t spec_bytes(const ParamSpec& s, WeightStorage st) {
  if (st == WeightStorage::MXFP4 && s.component == Component::RoutedExperts) {
    const uint64_t rows = uint64_t(s.shape[0]), cols = uint64_t(s.shape[1]);
    return rows * ((cols + 1) / 2) + rows * ((cols + 31) / 32);
  }
  return uint64_t(s.numel()) * 2;  // bf16
}

WeightBytes weight_bytes(const K3Config& c, WeightStorage st) {
  WeightBytes w;
  for (const ParamSpec& s : k3_param_specs(c)) {
    if (s.component == Component::RoutedExperts) {
      w.routed_experts += spec_bytes(s, st);
      if (s.shape[1] % 32 != 0) w.mxfp4_storable = false;
    } else {
      w.other += spec_bytes(s, st);
    }
  }
  return w;
}

CacheBytes decode_cache_bytes(const K3Config& c, int64_t context) {
  if (context <= 0) fail("context length must be positive, got " + std::to_string(context));
  CacheBytes b;
  b.context = context;
  const uint64_t H = uint64_t(c.kda_num_heads), D = uint64_t(c.kda_head_dim);
  const uint64_t L = uint64_t(context);
  b.kda_state_per_layer = H * D * D * 4;                                          // f32
  b.kda_conv_per_layer = 3 * uint64_t(c.short_conv_kernel_size - 1) * H * D * 4;  // f32
  b.mla_per_token_per_layer = uint64_t(c.kv_lora_rank + c.qk_rope_head_dim) * 2;  // bf16
  b.mha_per_token_per_layer =
      uint64_t(c.num_attention_heads) * uint64_t(c.mla_qk_head_dim() + c.v_head_dim) * 2;  // bf16
  const uint64_t n_mla = c.full_attn_layers.size(), n_kda = c.kda_layers.size();
  b.kda_total = n_kda * (b.kda_state_per_layer + b.kda_conv_per_layer);
  b.mla_total = n_mla * b.mla_per_token_per_layer * L;
  b.mha_total = uint64_t(c.num_hidden_layers) * b.mha_per_token_per_layer * L;
  b.ratio_vs_mha = double(b.mha_total) / double(b.total());
  return b;
}

Flops forward_flops_per_token(const K3Config& c, int64_t context) {
  if (context <= 0) fail("context length must be positive, got " + std::to_string(context));
  Flops f;
  double matmul_params = 0;
  for (const ParamSpec& s : k3_param_specs(c))
    if (s.shape.size() == 2 && is_active(s, c)) matmul_params += double(s.numel());
  f.matmul = 2.0 * matmul_params;
  const double n_mla = double(c.full_attn_layers.size()), n_kda = double(c.kda_layers.size());
  const double H = double(c.kda_num_heads), D = double(c.kda_head_dim);
  f.conv = n_kda * 2.0 * double(c.short_conv_kernel_size) * 3.0 * H * D;
  f.mla_attn = n_mla * 2.0 * double(c.num_attention_heads) * double(c.mla_qk_head_dim() + c.v_head_dim) *
               (double(context) / 2.0);
  f.kda_state = n_kda * 7.0 * H * D * D;
  return f;
}

uint64_t Placement::capacity_bytes() const { return uint64_t(gpu_mem_gib * 1024.0 * 1024.0 * 1024.0); }

Placement place(const K3Config& c, WeightStorage st, int64_t gpus, double gpu_mem_gib, int64_t context,
                int64_t batch) {
  if (gpus <= 0) fail("number of GPUs must be positive, got " + std::to_string(gpus));
  if (!(gpu_mem_gib > 0) || !std::isfinite(gpu_mem_gib)) fail("GPU memory must be a positive number of GiB");
  if (batch <= 0) fail("batch must be positive, got " + std::to_string(batch));
  Placement p;
  p.gpus = gpus;
  p.gpu_mem_gib = gpu_mem_gib;
  p.experts_per_device = (c.num_experts + gpus - 1) / gpus;
  p.sequences_per_device = (batch + gpus - 1) / gpus;
  uint64_t expert0_bytes = 0;  // expert 0 of every MoE layer; all experts are the same size
  for (const ParamSpec& s : k3_param_specs(c)) {
    if (s.component != Component::RoutedExperts) p.replicated_bytes += spec_bytes(s, st);
    else if (s.expert == 0) expert0_bytes += spec_bytes(s, st);
  }
  p.expert_bytes = uint64_t(p.experts_per_device) * expert0_bytes;
  p.cache_bytes = uint64_t(p.sequences_per_device) * decode_cache_bytes(c, context).total();
  return p;
}

}  // namespace k3
