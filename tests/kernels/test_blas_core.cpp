// kernels/blas_core.h: a lower SIMD target forced on an AVX-512 CPU keeps OpenBLAS off AVX-512.
#include "kernels/blas_core.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/simd_target.h"
#include "kernels/gemm.h"

using namespace k3;

TEST(BlasCore, AForcedTargetBelowAvx512KeepsOpenBlasOffAvx512) {
  if (!blas_core_selectable()) GTEST_SKIP() << "OPENBLAS_CORETYPE given at start, or OpenBLAS cannot re-select";
  // A product through OpenBLAS makes the choice (once per process).
  std::vector<float> a(64 * 64, 1.f), b(64 * 64, 2.f), c(64 * 64);
  gemm(false, false, 64, 64, 64, 1.f, a.data(), 64, b.data(), 64, 0.f, c.data(), 64);
  EXPECT_EQ(c[0], 128.f);
  // The process-wide forcing (K3_SIMD_TARGET, read before main) is what the choice saw; the
  // per-pass target of this test binary (set_simd_target_for_test) comes later.
  const char* forced = std::getenv("K3_SIMD_TARGET");
  std::string f = forced ? forced : "";
  std::transform(f.begin(), f.end(), f.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  const bool below_avx512 = !f.empty() && f != "avx3" && f != "avx512";
  if (below_avx512) {
    EXPECT_FALSE(blas_core_is_avx512(blas_core_name())) << "K3_SIMD_TARGET=" << f << " but OpenBLAS runs " << blas_core_name();
  } else {
    SUCCEED() << "no lower target forced: OpenBLAS keeps its own choice, " << blas_core_name();
  }
}

TEST(BlasCore, NamesTheAvx512Sets) {
  EXPECT_TRUE(blas_core_is_avx512("SkylakeX"));
  EXPECT_TRUE(blas_core_is_avx512("Cooperlake"));
  EXPECT_FALSE(blas_core_is_avx512("Haswell"));
  EXPECT_FALSE(blas_core_is_avx512("Zen"));
}
