// Expert-parallel parameter ownership (see expert_sharding.h).
#include "train/expert_sharding.h"

#include <algorithm>

#include "core/error.h"

namespace k3 {

int64_t routed_expert_index(const std::string& name) {
  static const std::string key = "block_sparse_moe.experts.";
  const size_t pos = name.find(key);
  if (pos == std::string::npos) return -1;
  size_t j = pos + key.size();
  int64_t e = 0;
  const size_t start = j;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') e = e * 10 + (name[j++] - '0');
  if (j == start) return -1;
  const std::string rest = name.substr(j);
  return rest == ".w1.weight" || rest == ".w2.weight" || rest == ".w3.weight" ? e : -1;
}

void ExpertSharding::build(const std::vector<ParamRef>& refs, const float* g0, int64_t total, int64_t E, int gsize,
                           int grank, int grp) {
  K3_ASSERT(gsize >= 1 && E % gsize == 0, "expert sharding: the expert count must be a multiple of the group size");
  group_size = gsize, group_rank = grank, group = grp;
  const int64_t per = E / gsize;
  owner.assign(refs.size(), -1);
  std::vector<std::pair<int64_t, int64_t>> experts;
  for (size_t i = 0; i < refs.size(); ++i) {
    const int64_t e = routed_expert_index(refs[i].name);
    if (e < 0) continue;
    owner[i] = int(e / per);
    const int64_t b = refs[i].g - g0;
    experts.emplace_back(b, b + refs[i].rows * refs[i].cols);
  }
  std::sort(experts.begin(), experts.end());
  trunk.clear();
  int64_t at = 0;
  for (const auto& [b, e] : experts) {
    if (b > at) trunk.emplace_back(at, b);
    at = std::max(at, e);
  }
  if (at < total) trunk.emplace_back(at, total);
  trunk_elems = 0;
  for (const auto& [b, e] : trunk) trunk_elems += e - b;
}

void ExpertSharding::pack(const float* g, float* out) const {
  for (const auto& [b, e] : trunk) {
    std::memcpy(out, g + b, sizeof(float) * size_t(e - b));
    out += e - b;
  }
}

void ExpertSharding::unpack(const float* in, float* g) const {
  for (const auto& [b, e] : trunk) {
    std::memcpy(g + b, in, sizeof(float) * size_t(e - b));
    in += e - b;
  }
}

}  // namespace k3
