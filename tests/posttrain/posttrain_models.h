// Small models for the post-training tests: the whole-model gradient test's shape (d 32, five
// layers with a dense FFN, MLA and KDA, AttnRes blocks of 2, 8 experts top-2, vocab 40) with
// the init recipe at std 0.2 and random norm gains, AttnRes queries and router biases.
#pragma once
#include <cstring>
#include <string>

#include "io/config.h"
#include "model/init.h"
#include "model/k3_model.h"

namespace k3::test {

inline K3Config pt_config() {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  c.hidden_size = 32;
  c.num_hidden_layers = 5;
  c.vocab_size = 40;
  c.kda_num_heads = 2;
  c.kda_head_dim = 8;
  c.full_attn_layers = {4};
  c.kda_layers = {1, 2, 3, 5};
  c.num_attention_heads = 2;
  c.q_lora_rank = 16;
  c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 8;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 1;
  c.routed_expert_hidden_size = 16;
  c.moe_intermediate_size = 8;
  c.first_k_dense_replace = 1;
  c.intermediate_size = 16;
  c.attn_res_block_size = 2;
  validate_config(c, "pt_config");
  return c;
}

inline WeightStore pt_store(const K3Config& c, uint64_t seed, double sd = 0.2) {
  WeightStore w = init_weights(c, {seed, ExpertStorage::Plain, sd});
  for (size_t i = 0; i < w.layout().size(); ++i) {
    const ParamSpec& s = w.layout().spec(i);
    const InitRule r = init_rule(s);
    if (r == InitRule::Zeros || r == InitRule::Ones) {
      ParamSpec alt = s;
      alt.name += "#pt";
      init_tensor(w.param(i), s.numel(), alt, InitRule::Normal, seed, 0.3, 1);
      if (r == InitRule::Ones)
        for (int64_t j = 0; j < s.numel(); ++j) w.param(i)[j] += 1.f;
    }
  }
  return w;
}

inline WeightStore pt_copy(const WeightStore& w) {
  WeightStore c(w.config(), ExpertStorage::Plain);
  std::memcpy(c.data(), w.data(), sizeof(float) * size_t(w.size()));
  return c;
}

}  // namespace k3::test
