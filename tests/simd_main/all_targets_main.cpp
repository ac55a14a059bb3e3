// GoogleTest main for the kernel tests: runs every test once per SIMD target this CPU supports
// (core/simd_target.h: AVX-512, AVX2, SSE4, ..., down to the portable baseline), so a machine
// with AVX-512 also checks its AVX2 and baseline code (gemma.cpp's per-target tests, by
// Highway's SetSupportedTargetsForTest). One gtest repetition per target; the target is set in
// the global environment's SetUp, printed before each pass and named in every failure.
// K3_SIMD_TARGET limits the passes to that target and the ones below it.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/simd_target.h"
#include "kernels/machine_probe.h"

namespace {

std::vector<k3::SimdTarget> g_targets;
size_t g_pass = 0;
std::string g_current;

class TargetEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const auto& t = g_targets[g_pass % g_targets.size()];
    ++g_pass;
    k3::set_simd_target_for_test(t.bits);
    g_current = t.name;
    // What runs, not only what is reported: the dispatched code's vector width.
    const int want = k3::f32_lanes_of_target(t.bits), got = k3::dispatched_f32_lanes();
    if (k3::simd_target().bits != t.bits || (want && got != want)) {
      std::fprintf(stderr, "could not switch the kernels to SIMD target %s (dispatched f32 lanes %d, expected %d)\n",
                   t.name.c_str(), got, want);
      std::abort();
    }
    std::printf("[ SIMD target %s ] (%s)\n", t.name.c_str(), k3::cpu_model_name().c_str());
  }
  void TearDown() override { k3::set_simd_target_for_test(0); }
};

// Names the target beside every failure (the pass header is far above in long logs).
class TargetInFailures : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::printf("  ^ failed on SIMD target %s\n", g_current.c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_targets = k3::simd_targets_supported();
  if (g_targets.empty()) {
    std::fprintf(stderr, "no SIMD target available\n");
    return 1;
  }
  GTEST_FLAG_SET(repeat, int(g_targets.size()) * GTEST_FLAG_GET(repeat));
  GTEST_FLAG_SET(recreate_environments_when_repeating, true);  // SetUp per pass
  ::testing::AddGlobalTestEnvironment(new TargetEnvironment);
  ::testing::UnitTest::GetInstance()->listeners().Append(new TargetInFailures);
  return RUN_ALL_TESTS();
}
