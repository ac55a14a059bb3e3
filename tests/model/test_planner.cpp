// Planner figures. K3 counts are asserted exactly (the integers the table gives for
// configs/kimi-k3.json) and against the report's rounded figures, 2.78 T total and 104.2 B
// active (docs/model.md section 1); the tiny config is checked against an independent
// hand count from the fixture shapes; bytes, cache, FLOPs and placement against their
// stated formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "io/config.h"
#include "model/planner.h"

namespace {
k3::K3Config planner_config(const char* name) { return k3::load_config(std::string(K3_SOURCE_DIR) + "/configs/" + name); }
}  // namespace

TEST(Planner, K3TotalAndActiveCounts) {
  k3::ParamCounts p = k3::count_params(planner_config("kimi-k3.json"));
  EXPECT_EQ(p.total, 2779484476000LL);
  EXPECT_EQ(p.active, 104189612640LL);
  EXPECT_EQ(std::round(double(p.total) / 1e10) / 100, 2.78);  // 2.78 T
  EXPECT_EQ(std::round(double(p.active) / 1e8) / 10, 104.2);  // 104.2 B
  // 92 MoE layers x 896 experts x 3 x 3584 x 3072.
  EXPECT_EQ(p.of(k3::Component::RoutedExperts).total, 92LL * 896 * 3 * 3584 * 3072);
  EXPECT_EQ(p.of(k3::Component::RoutedExperts).active, 92LL * 16 * 3 * 3584 * 3072);
  EXPECT_EQ(p.of(k3::Component::Embedding).total, 163840LL * 7168);
  EXPECT_EQ(p.of(k3::Component::Embedding).active, 0);
  EXPECT_EQ(p.of(k3::Component::LmHead).active, 163840LL * 7168);
  EXPECT_EQ(p.of(k3::Component::DenseFFN).total, 3LL * 33792 * 7168);
  EXPECT_EQ(p.of(k3::Component::SharedExperts).total, 92LL * 3 * 6144 * 7168);
  int64_t sum = 0;
  for (const auto& cc : p.by_component) sum += cc.total;
  EXPECT_EQ(sum, p.total);
}

// Independent count for the tiny config from the fixture shapes (ops/layer_kda.json,
// layer_mla.json): d 128, V 256, 9 KDA + 4 MLA layers, 1 dense + 12 MoE layers.
TEST(Planner, TinyCountsByHand) {
  const int64_t d = 128, V = 256;
  const int64_t kda = 3 * 64 * 128 + 3 * 64 * 4 + 16 * 128 + 64 * 16 + 4 * 128 + 64 * 128 + 16 + 128 * 64 + 4 + 64;
  const int64_t mla = 64 * 128 + 64 + 128 * 64 + 40 * 128 + 32 + 160 * 32 + 128 * 64 + 64 * 128;
  const int64_t dense = 3 * 96 * 128;
  const int64_t moe_fixed = 8 * 128 + 8 + 64 * 128 + 128 * 64 + 64 + 3 * 96 * 128;
  const int64_t expert = 3 * 48 * 64;
  const int64_t per_layer = 6 * d;
  const int64_t total = 2 * V * d + 3 * d + 13 * per_layer + 9 * kda + 4 * mla + dense + 12 * (moe_fixed + 8 * expert);
  const int64_t active = total - V * d - 12 * 6 * expert;
  k3::ParamCounts p = k3::count_params(planner_config("tiny.json"));
  EXPECT_EQ(p.total, total);
  EXPECT_EQ(p.active, active);
  EXPECT_EQ(p.of(k3::Component::KDA).total, 9 * kda);
  EXPECT_EQ(p.of(k3::Component::MLA).total, 4 * mla);
}

TEST(Planner, WeightBytes) {
  k3::K3Config c = planner_config("kimi-k3.json");
  k3::ParamCounts p = k3::count_params(c);
  const int64_t routed = p.of(k3::Component::RoutedExperts).total;
  k3::WeightBytes bf = k3::weight_bytes(c, k3::WeightStorage::BF16);
  EXPECT_EQ(bf.total(), uint64_t(p.total) * 2);
  k3::WeightBytes mx = k3::weight_bytes(c, k3::WeightStorage::MXFP4);
  EXPECT_EQ(mx.routed_experts, uint64_t(routed) / 32 * 17);  // 4.25 bits = 17/32 bytes
  EXPECT_EQ(mx.other, uint64_t(p.total - routed) * 2);
  EXPECT_EQ(k3::parse_weight_storage("mxfp4"), k3::WeightStorage::MXFP4);
  EXPECT_EQ(k3::parse_weight_storage("bf16"), k3::WeightStorage::BF16);
  EXPECT_THROW(k3::parse_weight_storage("fp8"), k3::Error);
  EXPECT_TRUE(mx.mxfp4_storable);
  // Tiny: w2 input width 48 is not a multiple of 32; the estimate rounds rows up.
  k3::WeightBytes t = k3::weight_bytes(planner_config("tiny.json"), k3::WeightStorage::MXFP4);
  EXPECT_FALSE(t.mxfp4_storable);
  EXPECT_EQ(t.routed_experts, 12ULL * 8 * (2 * 48 * (32 + 2) + 64 * (24 + 2)));
}

TEST(Planner, DecodeCache) {
  k3::K3Config c = planner_config("kimi-k3.json");
  const int64_t L = 1 << 20;
  k3::CacheBytes b = k3::decode_cache_bytes(c, L);
  EXPECT_EQ(b.kda_state_per_layer, 96ULL * 128 * 128 * 4);
  EXPECT_EQ(b.kda_conv_per_layer, 3ULL * 3 * 96 * 128 * 4);
  EXPECT_EQ(b.mla_per_token_per_layer, (512ULL + 64) * 2);
  EXPECT_EQ(b.kda_total, 69 * (b.kda_state_per_layer + b.kda_conv_per_layer));
  EXPECT_EQ(b.mla_total, 24ULL * 576 * 2 * L);
  EXPECT_EQ(b.mha_total, 93ULL * 96 * (192 + 128) * 2 * L);
  EXPECT_NEAR(b.ratio_vs_mha, double(b.mha_total) / double(b.total()), 1e-9);
  EXPECT_GT(b.ratio_vs_mha, 100.0);
  // KDA state does not grow with the context; MLA cache does, linearly.
  k3::CacheBytes b2 = k3::decode_cache_bytes(c, 2 * L);
  EXPECT_EQ(b2.kda_total, b.kda_total);
  EXPECT_EQ(b2.mla_total, 2 * b.mla_total);
  EXPECT_THROW(k3::decode_cache_bytes(c, 0), k3::Error);
}

TEST(Planner, ForwardFlops) {
  k3::K3Config c = planner_config("tiny.json");
  k3::ParamCounts p = k3::count_params(c);
  k3::Flops f = k3::forward_flops_per_token(c, 1000);
  // Active rank-2 parameters = active minus the vectors and the rank-3 conv weights.
  int64_t non_matrix = 0;
  for (const auto& s : k3::k3_param_specs(c))
    if (s.shape.size() != 2) non_matrix += s.numel();
  EXPECT_DOUBLE_EQ(f.matmul, 2.0 * double(p.active - non_matrix));
  EXPECT_DOUBLE_EQ(f.mla_attn, 4 * 2.0 * 4 * (32 + 16) * 500.0);
  EXPECT_DOUBLE_EQ(f.kda_state, 9 * 7.0 * 4 * 16 * 16);
  EXPECT_DOUBLE_EQ(f.conv, 9 * 2.0 * 4 * 3 * 64);
  EXPECT_DOUBLE_EQ(f.total(), f.matmul + f.conv + f.mla_attn + f.kda_state);
  // K3: the matmul term dominates at short context: close to 2 x active.
  k3::K3Config k = planner_config("kimi-k3.json");
  k3::Flops fk = k3::forward_flops_per_token(k, 4096);
  double active = double(k3::count_params(k).active);
  EXPECT_GT(fk.matmul, 1.99 * active);
  EXPECT_LT(fk.matmul, 2.0 * active);
}

TEST(Planner, Placement) {
  k3::K3Config c = planner_config("kimi-k3.json");
  k3::WeightBytes mx = k3::weight_bytes(c, k3::WeightStorage::MXFP4);
  k3::Placement p = k3::place(c, k3::WeightStorage::MXFP4, 64, 141.0, 131072, 64);
  EXPECT_EQ(p.experts_per_device, 14);  // 896 / 64
  EXPECT_EQ(p.sequences_per_device, 1);
  EXPECT_EQ(p.replicated_bytes, mx.other);
  EXPECT_EQ(p.expert_bytes * 64, mx.routed_experts);
  EXPECT_EQ(p.cache_bytes, k3::decode_cache_bytes(c, 131072).total());
  EXPECT_TRUE(p.fits());
  // The routed experts alone are ~1.45 TB in MXFP4: eight 141 GiB devices cannot hold them.
  k3::Placement q = k3::place(c, k3::WeightStorage::MXFP4, 8, 141.0, 4096, 1);
  EXPECT_EQ(q.experts_per_device, 112);
  EXPECT_FALSE(q.fits());
  // Uneven split rounds up.
  EXPECT_EQ(k3::place(c, k3::WeightStorage::BF16, 3, 80, 10, 5).experts_per_device, 299);
  EXPECT_EQ(k3::place(c, k3::WeightStorage::BF16, 3, 80, 10, 5).sequences_per_device, 2);
  EXPECT_THROW(k3::place(c, k3::WeightStorage::BF16, 0, 80, 10, 1), k3::Error);
  EXPECT_THROW(k3::place(c, k3::WeightStorage::BF16, 2, 0, 10, 1), k3::Error);
  EXPECT_THROW(k3::place(c, k3::WeightStorage::BF16, 2, 80, 10, 0), k3::Error);
}
