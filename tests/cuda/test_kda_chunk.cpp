// launch_kda_chunk (cuda/kernels.h, src/cuda/kernels/kda_chunk.cu) on the GPU against the double
// recurrence (kernels/kda.h): relative RMS of o and of the final state <= 1e-2 (bf16 operands,
// one rounding of 2^-9 each, f32 accumulation and state; the CPU kernel's bf16 mode measures
// 3.3e-3, docs/kda-numerics.md; the host emulation of this kernel, test_kda_chunk_emulated.cpp,
// 3e-3 to 4e-3). NaN/Inf first, output and state poisoned before each run, fresh inputs per
// case: the gate pinned at the floor, long sequences with carried state over several calls,
// ragged lengths, and the unbounded gate (g down to -50) where only the safe diagonal path is
// valid. Skipped (with the reason) where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/kernels.h"
#include "cuda_test.h"
#include "kda_chunk_cases.h"

using namespace k3;
using namespace k3::test::kda_cases;

namespace {

constexpr double kTol = 1e-2;

struct Result {
  std::vector<float> o, s;
  double eo, es;
};

// The kernel over `in` in calls of `pieces` tokens (the rest in a last call), one state carried
// through (zero-initialised and not written when !with_state), against the double recurrence.
Result run_gpu(const Inputs& in, bool dense, bool with_state, const std::vector<int64_t>& pieces = {}) {
  auto* dev = test::cuda_device();
  const float scale = 1.f / std::sqrt(float(in.Dk));
  const int64_t H = in.H, Dk = in.Dk, Dv = in.Dv;
  Buf<float> q = test::to_dev(in.q), k = test::to_dev(in.k), v = test::to_dev(in.v), g = test::to_dev(in.g),
             b = test::to_dev(in.beta);
  Buf<float> o = test::poisoned<float>(size_t(in.T * in.H * in.Dv));
  Buf<float> s = with_state ? test::to_dev(in.s0) : test::poisoned<float>(in.s0.size());
  std::vector<int64_t> cuts = {0};
  for (int64_t p : pieces) cuts.push_back(cuts.back() + p);
  if (cuts.back() != in.T) cuts.push_back(in.T);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const int64_t t0 = cuts[i], t1 = cuts[i + 1];
    cuda::launch_kda_chunk(dev->stream(), o.data() + t0 * H * Dv, with_state ? s.data() : nullptr,
                           q.data() + t0 * H * Dk, k.data() + t0 * H * Dk, v.data() + t0 * H * Dv,
                           g.data() + t0 * H * Dk, b.data() + t0 * H, t1 - t0, H, Dk, Dv, scale, dense);
  }
  dev->synchronize();
  Result r{test::to_host(o), test::to_host(s), 0, 0};
  std::vector<double> sref(in.s0.begin(), in.s0.end());
  const std::vector<double> oref = reference(in, sref, scale, 0, in.T);
  r.eo = rel_rms(r.o.data(), oref.data(), int64_t(oref.size()));
  r.es = with_state ? rel_rms(r.s.data(), sref.data(), int64_t(sref.size())) : 0.0;
  return r;
}

void expect_accurate(const Inputs& in, bool dense, bool with_state, const std::vector<int64_t>& pieces = {}) {
  const Result r = run_gpu(in, dense, with_state, pieces);
  const std::string what = std::string(dense ? "dense" : "safe") + ", T = " + std::to_string(in.T) +
                           ", H = " + std::to_string(in.H) + ", Dk = " + std::to_string(in.Dk) +
                           ", Dv = " + std::to_string(in.Dv) + ", calls = " + std::to_string(pieces.size() + 1);
  std::printf("  %-62s rel o %.2e  rel S %.2e\n", what.c_str(), r.eo, r.es);
  ASSERT_EQ(count_nonfinite(r.o), 0) << what << ": non-finite or unwritten outputs";
  if (with_state) ASSERT_EQ(count_nonfinite(r.s), 0) << what << ": non-finite state";
  EXPECT_LE(r.eo, kTol) << what;
  EXPECT_LE(r.es, kTol) << what;
  EXPECT_GT(r.eo, 1e-5) << what << ": bf16 operands should leave a visible rounding error";
}

}  // namespace

TEST(KdaChunkCuda, DenseFloorPinnedGateEveryWidth) {
  K3_REQUIRE_CUDA();
  unsigned seed = 100;
  for (int64_t Dk : {64, 128}) {
    for (int64_t Dv : {64, 128}) expect_accurate(make_inputs(300, 3, Dk, Dv, Gate::FloorPinned, true, ++seed), true, true);
  }
}

TEST(KdaChunkCuda, SafePathBoundedGateEveryWidth) {
  K3_REQUIRE_CUDA();
  unsigned seed = 200;
  for (int64_t Dk : {64, 128}) {
    for (int64_t Dv : {64, 128}) expect_accurate(make_inputs(300, 3, Dk, Dv, Gate::Bounded, true, ++seed), false, true);
  }
}

TEST(KdaChunkCuda, RaggedLengths) {
  K3_REQUIRE_CUDA();
  unsigned seed = 300;
  for (int64_t T : {1, 15, 63, 64, 65, 1000}) {
    expect_accurate(make_inputs(T, 2, 64, 64, Gate::FloorPinned, true, ++seed), true, true);
    expect_accurate(make_inputs(T, 2, 128, 128, Gate::Bounded, false, ++seed), false, false);
  }
}

TEST(KdaChunkCuda, NullStateIsZeroAndNotWritten) {
  K3_REQUIRE_CUDA();
  const Inputs in = make_inputs(100, 2, 128, 128, Gate::Bounded, false, 400);
  const Result r = run_gpu(in, true, false);
  EXPECT_LE(r.eo, kTol);
  EXPECT_EQ(count_nonfinite(r.s), int64_t(r.s.size())) << "the poisoned state buffer was written";
}

TEST(KdaChunkCuda, LongSequenceCarriedStateAcrossCalls) {
  K3_REQUIRE_CUDA();
  // T = 4096 in one call and in four calls continuing one state (ragged pieces).
  const Inputs in = make_inputs(4096, 4, 128, 128, Gate::FloorPinned, true, 500);
  expect_accurate(in, true, true);
  expect_accurate(in, true, true, {1000, 1, 2047});
  expect_accurate(in, false, true, {64, 1936, 63});
}

TEST(KdaChunkCuda, UnboundedGateNeedsTheSafePath) {
  K3_REQUIRE_CUDA();
  // g down to -50: the safe path stays accurate; the dense path is only valid for the bounded
  // gate (g >= -5, docs/kda-numerics.md): here its anchored factors overflow.
  const Inputs in = make_inputs(1000, 2, 128, 128, Gate::Unbounded, true, 600);
  expect_accurate(in, false, true);
  const Result d = run_gpu(in, true, true);
  std::printf("  dense on the unbounded gate: %lld non-finite outputs, rel o %.2e\n",
              (long long)count_nonfinite(d.o), d.eo);
  EXPECT_TRUE(count_nonfinite(d.o) > 0 || !(d.eo <= 0.1));
}

TEST(KdaChunkCuda, RepeatedRunsAreBitwiseEqual) {
  K3_REQUIRE_CUDA();
  // A result that moves between runs on the same inputs is a race (docs/cuda-kda.md).
  const Inputs in = make_inputs(777, 8, 128, 128, Gate::FloorPinned, true, 700);
  for (bool dense : {true, false}) {
    const Result a = run_gpu(in, dense, true), b = run_gpu(in, dense, true);
    EXPECT_EQ(a.o, b.o) << (dense ? "dense" : "safe");
    EXPECT_EQ(a.s, b.s) << (dense ? "dense" : "safe");
  }
}

TEST(KdaChunkCuda, UnsupportedHeadWidthIsAClearError) {
  // Checked on the host before anything touches a device (runs without a GPU too).
  try {
    cuda::launch_kda_chunk(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 10, 2, 96, 128,
                           1.f, true);
    ADD_FAILURE() << "Dk = 96 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Dk and Dv in {64, 128}"), std::string::npos) << e.what();
  }
}
