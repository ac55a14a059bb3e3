// Random test models (see random_model.h).
#include "common/random_model.h"

#include <string>

#include "model/init.h"

namespace k3::test {

K3Config tiny_config(int64_t block_size, int64_t expert_width) {
  K3Config c = load_config(std::string(K3_SOURCE_DIR) + "/configs/tiny.json");
  if (block_size > 0) c.attn_res_block_size = block_size;
  if (expert_width > 0) c.moe_intermediate_size = expert_width;
  return c;
}

K3Config four_layer_config() {
  K3Config c = tiny_config(2, 64);
  c.num_hidden_layers = 4;
  c.full_attn_layers = {4};
  c.kda_layers = {1, 2, 3};
  return c;
}

K3Model random_model(const K3Config& c, uint64_t seed, ExpertStorage ex) {
  InitOptions io;
  io.seed = seed, io.experts = ex;
  WeightStore w = init_weights(c, io);
  for (size_t i = 0; i < w.layout().size(); ++i) {
    const ParamSpec& s = w.layout().spec(i);
    const InitRule r = init_rule(s);
    if (r != InitRule::Zeros && r != InitRule::Ones) continue;
    ParamSpec alt = s;
    alt.name += "#session";
    init_tensor(w.param(i), s.numel(), alt, InitRule::Normal, seed, 0.1, 1);
    if (r == InitRule::Ones)
      for (int64_t j = 0; j < s.numel(); ++j) w.param(i)[j] += 1.f;
  }
  return K3Model(std::move(w));
}

std::vector<int32_t> make_ids(int64_t T, int64_t V, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(T));
  uint32_t x = seed * 2654435761u + 7;
  for (auto& id : ids) {
    x = x * 1664525u + 1013904223u;
    id = int32_t((x >> 8) % uint32_t(V));
  }
  return ids;
}

}  // namespace k3::test
