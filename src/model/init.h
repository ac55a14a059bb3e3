// Random initialisation of a K3 model (what `k3cpp init` writes), deterministic given the
// seed on every platform: each tensor draws from its own splitmix64 stream seeded from the
// seed and the tensor's released name, normals by Box-Muller (no std:: distributions), so a
// tensor's values depend on nothing but (seed, name, shape, rule).
//
// Recipes, per parameter (init_rule):
//  - Zeros: AttnRes pseudo-queries (*_res_proj; "Attention Residuals", arXiv 2603.15031:
//    zero queries start as uniform mixing; docs/model.md section 2) and the router correction
//    bias (e_score_correction_bias; DeepSeek loss-free balancing starts it at 0).
//  - Ones: every RMSNorm gain (layer norms, res_norm, q/kv latent norms, o_norm, the latent
//    MoE norm, the final norm).
//  - ALog: A_log[h] = log(U(1, 16)) per head; DtBias: dt_bias = softplus^-1(dt) with
//    dt = exp(U(log 1e-3, log 1e-1)) clamped at 1e-4, per channel. This is the KDA layer's
//    init in fla (fla/layers/kda.py, KimiDeltaAttention.__init__), taken from Mamba
//    (mamba_ssm/modules/mamba_simple.py, dt_min 1e-3, dt_max 1e-1, dt_init_floor 1e-4).
//  - ConvUniform: depthwise short-conv taps U(-1/sqrt(K), 1/sqrt(K)), PyTorch's nn.Conv1d
//    default (kaiming_uniform with a = sqrt(5): bound 1/sqrt(fan_in), fan_in = K), which
//    fla's ShortConvolution keeps.
//  - Normal: N(0, 0.02^2) for the embedding, lm_head and every other matrix (the GPT-2 /
//    Megatron-LM init_method_std 0.02).
//  - ScaledNormal: output projections that write into the residual stream, N(0, (0.02 /
//    sqrt(2 L))^2) (GPT-2's residual scaling, Megatron-LM scaled_init_method_normal):
//    self_attn.o_proj, mlp.down_proj, shared_experts.down_proj, routed_expert_up_proj and
//    the routed experts' w2.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "model/weights.h"

namespace k3 {

enum class InitRule { Zeros, Ones, ALog, DtBias, ConvUniform, Normal, ScaledNormal };
const char* init_rule_name(InitRule r);
InitRule init_rule(const ParamSpec& spec);

struct InitOptions {
  uint64_t seed = 0;
  ExpertStorage experts = ExpertStorage::Plain;  // Mxfp4: experts drawn in f32, then quantised
  double std = 0.02;                             // the Normal rule's standard deviation
  // Expert parallelism: routed experts it rejects (by expert index) are left zero and never
  // written, so their pages take no memory; every tensor has its own stream (seed, name), so
  // the kept ones are drawn exactly as in a whole init.
  std::function<bool(int64_t expert)> keep_expert = nullptr;  // none: every expert (no -Wmissing-field-initializers)
};

// A freshly initialised store. progress(done, total) is called from the calling thread after
// each layer (total = number of parameters). With Mxfp4 experts, a routed width that is not a
// multiple of 32 is a k3::Error naming the tensor.
WeightStore init_weights(const K3Config& cfg, const InitOptions& opt,
                         const std::function<void(int64_t done, int64_t total)>& progress = {});

// Fills dst[0, n) by `rule` from the stream of (seed, name); exposed for tests.
void init_tensor(float* dst, int64_t n, const ParamSpec& spec, InitRule rule, uint64_t seed, double std,
                 int64_t num_layers);

}  // namespace k3
