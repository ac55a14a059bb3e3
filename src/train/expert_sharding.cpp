// Expert-parallel parameter ownership (see expert_sharding.h).
#include "train/expert_sharding.h"

#include <algorithm>

#include "core/error.h"
#include "model/weights.h"

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
                           int grank, int grp, int world) {
  K3_ASSERT(gsize >= 1 && E % gsize == 0 && world % gsize == 0,
            "expert sharding: the expert count and the world size must be multiples of the group size");
  group_size = gsize, group_rank = grank, group = grp, world_rank = grp * gsize + grank;
  const int64_t per = E / gsize;
  owner.assign(refs.size(), -1);
  holder.assign(refs.size(), -1);
  std::vector<std::pair<int64_t, int64_t>> experts;
  for (size_t i = 0; i < refs.size(); ++i) {
    const int64_t e = routed_expert_index(refs[i].name);
    if (e < 0) continue;
    owner[i] = holder[i] = int(e / per);  // group 0's owner: world rank = group rank
    const int64_t b = refs[i].g - g0;
    experts.emplace_back(b, b + refs[i].rows * refs[i].cols);
  }
  std::sort(experts.begin(), experts.end());
  // Adjacent experts with only the layout's alignment padding between them make one run, so
  // the trunk (zeroed, packed and unpacked every step) never touches a page inside a run of
  // experts (another rank's take no memory).
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const auto& r : experts)
    if (!runs.empty() && r.first <= (runs.back().second + ParamLayout::kParamAlign - 1) / ParamLayout::kParamAlign *
                                         ParamLayout::kParamAlign)
      runs.back().second = std::max(runs.back().second, r.second);
    else
      runs.push_back(r);
  experts = std::move(runs);
  trunk.clear();
  int64_t at = 0;
  for (const auto& [b, e] : experts) {
    if (b > at) trunk.emplace_back(at, b);
    at = std::max(at, e);
  }
  if (at < total) trunk.emplace_back(at, total);
  trunk_elems = 0;
  for (const auto& [b, e] : trunk) trunk_elems += e - b;
  trunk_bounds.assign(size_t(world) + 1, 0);
  for (int r = 0; r <= world; ++r) trunk_bounds[size_t(r)] = trunk_elems * r / world;
}

void ExpertSharding::shard_trunk(const std::vector<ParamRef>& refs, const float* g0, const std::vector<size_t>& cut) {
  const int world = int(cut.size()) - 1;
  K3_ASSERT(world == int(trunk_bounds.size()) - 1, "expert sharding: the trunk cut has another rank count");
  std::vector<size_t> tix;  // the trunk parameters, in order
  for (size_t i = 0; i < refs.size(); ++i)
    if (owner[i] < 0) tix.push_back(i);
  K3_ASSERT(cut.back() == tix.size(), "expert sharding: the trunk cut does not cover the trunk");
  for (int r = 0; r < world; ++r)
    for (size_t t = cut[size_t(r)]; t < cut[size_t(r) + 1]; ++t) holder[tix[t]] = r;
  trunk_bounds[0] = 0, trunk_bounds[size_t(world)] = trunk_elems;
  for (int r = 1; r < world; ++r)
    trunk_bounds[size_t(r)] = cut[size_t(r)] < tix.size() ? packed_offset(refs[tix[cut[size_t(r)]]].g - g0) : trunk_elems;
}

int64_t ExpertSharding::packed_offset(int64_t flat) const {
  int64_t at = 0;
  for (const auto& [b, e] : trunk) {
    if (flat < e) {
      K3_ASSERT(flat >= b, "expert sharding: offset inside a routed expert");
      return at + flat - b;
    }
    at += e - b;
  }
  return at;
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
