// Few-row products (kernels/gemv.h, reached through gemm for M <= kGemvMaxRows): against the
// double reference for both op(B), transposed A, K and N tails, alpha/beta (beta = 0 clears
// NaN); against OpenBLAS sgemm (M above the threshold) on the same rows; batch invariance: a
// row alone, in any batch size and with 1 or 2 threads, is bitwise the same.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/fixture.h"
#include "core/dtype.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"

using namespace k3;

namespace {

std::vector<float> normal(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST(GemmFewRows, MatchesReference) {
  for (int64_t M : {1, 2, 3, 5, 8, 11, 24})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 70}, {16, 16}, {130, 9}, {300, 260}})
      for (bool ta : {false, true})
        for (bool tb : {true, false})
          for (float beta : {0.f, 0.5f}) {
            const std::vector<float> A = normal(M * K, 1), B = normal(N * K, 2);
            const int64_t lda = ta ? M + 1 : K + 2, ldb = tb ? K + 1 : N + 3, ldc = N + 2;
            std::vector<float> a(size_t((ta ? K : M) * lda), 0.f), b(size_t((tb ? N : K) * ldb), 0.f);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t k = 0; k < K; ++k) a[ta ? k * lda + m : m * lda + k] = A[m * K + k];
            for (int64_t n = 0; n < N; ++n)
              for (int64_t k = 0; k < K; ++k) b[tb ? n * ldb + k : k * ldb + n] = B[n * K + k];
            std::vector<float> c(M * ldc, beta == 0.f ? NAN : 0.25f), ref(M * ldc, 0.25f);
            gemm_few_rows(ta, tb, M, N, K, 1.5f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
            gemm_few_rows_reference<float>(ta, tb, M, N, K, 1.5f, a.data(), lda, b.data(), ldb, beta, ref.data(), ldc);
            // op(B) = B sums each element sequentially over k in float: at K = 260 the partial
            // sums reach ~25 in magnitude, so rounding alone moves a result by ~2.5e-5
            // (measured 2.4e-5 at M 24, N 300, element (13, 228), with or without FMA).
            for (int64_t m = 0; m < M; ++m)
              test::expect_close(c.data() + m * ldc, ref.data() + m * ldc, N, 5e-5, 1e-5,
                                 "M " + std::to_string(M) + " N " + std::to_string(N) + " ta " +
                                     std::to_string(ta) + " tb " + std::to_string(tb) + " beta " +
                                     std::to_string(beta));
          }
}

TEST(GemmFewRows, AgreesWithSgemmAndIsBatchInvariant) {
  const int64_t K = 700, N = 260, Mbig = kGemvMaxRows + 8;  // N K > 65536: the threaded split
  const std::vector<float> A = normal(Mbig * K, 3), Bt = normal(N * K, 4), B = normal(K * N, 5);
  const int before = num_threads();
  for (bool tb : {true, false}) {
    const float* b = tb ? Bt.data() : B.data();
    const int64_t ldb = tb ? K : N;
    std::vector<float> big(Mbig * N);
    gemm(false, tb, Mbig, N, K, 1.f, A.data(), K, b, ldb, 0.f, big.data(), N);  // OpenBLAS sgemm
    std::vector<float> row5;
    for (int threads : {1, 2})
      for (int64_t M : {int64_t(1), int64_t(6), int64_t(9), kGemvMaxRows}) {
        set_num_threads(threads);
        // Rows [5 - (M - 1) / 2, ...): row 5 sits at a different position of each batch.
        const int64_t m0 = std::max<int64_t>(0, 5 - (M - 1) / 2);
        std::vector<float> c(M * N);
        gemm(false, tb, M, N, K, 1.f, A.data() + m0 * K, K, b, ldb, 0.f, c.data(), N);
        test::expect_close(c.data(), big.data() + m0 * N, M * N, 1e-4, 1e-4, "few rows vs sgemm");
        const std::vector<float> r(c.begin() + (5 - m0) * N, c.begin() + (6 - m0) * N);
        if (row5.empty()) row5 = r;
        EXPECT_EQ(r, row5) << "row 5 with M " << M << ", " << threads << " threads, tb " << tb;
      }
    row5.clear();
  }
  set_num_threads(before);
}

// bf16 B (kernels/weight_mat.h): the few-row tiles widen B in registers in the f32 order, so
// they equal gemm_few_rows on the widened B bit for bit (both op(B), tails, threads); above the
// threshold, gemm widens panels for sgemm (equal to sgemm on the widened B within rounding).
TEST(GemmBf16, FewRowsBitwiseAndPanelsMatchTheWidenedF32Product) {
  for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 70}, {300, 260}, {260, 700}})
    for (bool tb : {true, false})
      for (int64_t M : {int64_t(1), int64_t(3), int64_t(8), kGemvMaxRows, kGemvMaxRows + 7}) {
        const std::vector<float> A = normal(M * K, 7), Bsrc = normal(N * K, 8);
        std::vector<uint16_t> B16(Bsrc.size());
        std::vector<float> Bw(Bsrc.size());
        for (size_t i = 0; i < Bsrc.size(); ++i) B16[i] = f32_to_bf16(Bsrc[i]);
        widen_bf16(Bw.data(), B16.data(), int64_t(B16.size()));
        for (size_t i = 0; i < Bw.size(); ++i) ASSERT_EQ(Bw[i], bf16_to_f32(B16[i])) << i;
        const int64_t ldb = tb ? K : N;
        std::vector<float> c(M * N, 0.25f), ref(M * N, 0.25f);
        gemm(false, tb, M, N, K, 1.5f, A.data(), K, Mat::from_bf16(B16.data()), ldb, 0.5f, c.data(), N);
        gemm(false, tb, M, N, K, 1.5f, A.data(), K, Bw.data(), ldb, 0.5f, ref.data(), N);
        const std::string what = "M " + std::to_string(M) + " N " + std::to_string(N) + " tb " + std::to_string(tb);
        if (M <= kGemvMaxRows)
          EXPECT_EQ(c, ref) << what;
        else
          test::expect_close(c.data(), ref.data(), M * N, 1e-4, 1e-5, what);
      }
  std::vector<uint16_t> row = {f32_to_bf16(1.5f), f32_to_bf16(-2.f), f32_to_bf16(3.25f), f32_to_bf16(0.f),
                               f32_to_bf16(7.f), f32_to_bf16(-0.125f)};
  std::vector<float> out(3);
  mat_row(out.data(), Mat::from_bf16(row.data()), 1, 3);
  EXPECT_EQ(out, (std::vector<float>{0.f, 7.f, -0.125f}));
}
