// Builds one decoder layer's weight views from two binders (model/k3_model.cpp: the store's,
// a trunk ring's and the gradient buffer's; k3_model_device.cpp: a device copy's). Internal to
// src/model.
#pragma once
#include <string>

#include "io/config.h"
#include "model/decoder.h"
#include "model/param_specs.h"

namespace k3 {

// Builds one layer's views; `P(name)` gives a parameter's f32 pointer, `X(name_fn)` a routed
// expert matrix (name_fn() builds its name: shape-only binders never pay for the strings).
template <typename R, typename ParamFn, typename ExpertFn>
LayerWeightsT<R> bind_layer(const K3Config& c, int64_t layer, ParamFn&& P_full, ExpertFn&& X) {
  const std::string p = layer_prefix(layer);
  auto P = [&](const std::string& suffix) { return P_full(p + suffix); };
  LayerWeightsT<R> L;
  L.input_norm = P("input_layernorm.weight");
  L.post_norm = P("post_attention_layernorm.weight");
  L.attn_res_norm = P("self_attention_res_norm.weight");
  L.attn_res_proj = P("self_attention_res_proj.weight");
  L.mlp_res_norm = P("mlp_res_norm.weight");
  L.mlp_res_proj = P("mlp_res_proj.weight");
  L.is_mla = c.is_mla_layer(layer);
  const std::string a = "self_attn.";
  if (L.is_mla) {
    L.mla.q_a_proj = P(a + "q_a_proj.weight");
    L.mla.q_a_norm = P(a + "q_a_layernorm.weight");
    L.mla.q_b_proj = P(a + "q_b_proj.weight");
    L.mla.kv_a_proj = P(a + "kv_a_proj_with_mqa.weight");
    L.mla.kv_a_norm = P(a + "kv_a_layernorm.weight");
    L.mla.kv_b_proj = P(a + "kv_b_proj.weight");
    L.mla.o_proj = P(a + "o_proj.weight");
    L.mla.g_proj = c.mla_use_output_gate ? P(a + "g_proj.weight") : nullptr;
  } else {
    KDAWeightsT<R>& k = L.kda;
    k.q_proj = P(a + "q_proj.weight");
    k.k_proj = P(a + "k_proj.weight");
    k.v_proj = P(a + "v_proj.weight");
    k.q_conv = P(a + "q_conv1d.weight");
    k.k_conv = P(a + "k_conv1d.weight");
    k.v_conv = P(a + "v_conv1d.weight");
    k.f_a = P(a + "f_a_proj.weight");
    k.f_b = P(a + "f_b_proj.weight");
    k.b_proj = P(a + "b_proj.weight");
    k.g_proj = P(a + "g_proj.weight");
    k.o_norm = P(a + "o_norm.weight");
    k.o_proj = P(a + "o_proj.weight");
    k.A_log = P(a + "A_log");
    k.dt_bias = P(a + "dt_bias");
  }
  L.is_moe = c.is_moe_layer(layer);
  if (!L.is_moe) {
    L.dense_gate = P("mlp.gate_proj.weight");
    L.dense_up = P("mlp.up_proj.weight");
    L.dense_down = P("mlp.down_proj.weight");
    return L;
  }
  const std::string m = "block_sparse_moe.";
  LatentMoEWeightsT<R>& e = L.moe;
  e.router = P(m + "gate.weight");
  e.router_bias = P(m + "gate.e_score_correction_bias");
  e.down = P(m + "routed_expert_down_proj.weight");
  e.up = P(m + "routed_expert_up_proj.weight");
  e.latent_norm = c.latent_moe_use_norm ? P(m + "routed_expert_norm.weight") : nullptr;
  if (c.num_shared_experts > 0) {
    e.shared_w1 = P(m + "shared_experts.gate_proj.weight");
    e.shared_w3 = P(m + "shared_experts.up_proj.weight");
    e.shared_w2 = P(m + "shared_experts.down_proj.weight");
  } else {
    e.shared_w1 = e.shared_w3 = e.shared_w2 = nullptr;
  }
  const int64_t E = c.num_experts;
  e.w1.resize(size_t(E));
  e.w3.resize(size_t(E));
  e.w2.resize(size_t(E));
  for (int64_t j = 0; j < E; ++j) {
    auto name = [&](const char* w) { return p + m + "experts." + std::to_string(j) + "." + w; };
    e.w1[size_t(j)] = X([&] { return name("w1.weight"); }, 0);
    e.w3[size_t(j)] = X([&] { return name("w3.weight"); }, 1);
    e.w2[size_t(j)] = X([&] { return name("w2.weight"); }, 2);
  }
  return L;
}


}  // namespace k3
