// Random test models: the init recipe with random AttnRes pseudo-queries, gains and router
// biases (std 0.1), so every AttnRes read mixes non-uniformly and routing is not a tie.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/k3_model.h"

namespace k3::test {

K3Config tiny_config(int64_t block_size = 0, int64_t expert_width = 0);  // configs/tiny.json
// configs/tiny.json shrunk to 4 layers: dense layer 0, KDA 1-3, MLA 4, AttnRes blocks of 2,
// expert width 64 (so MXFP4 storage is possible).
K3Config four_layer_config();
K3Model random_model(const K3Config& c, uint64_t seed, ExpertStorage ex = ExpertStorage::Plain);
std::vector<int32_t> make_ids(int64_t T, int64_t V, uint32_t seed);  // deterministic pseudo-random ids

}  // namespace k3::test
