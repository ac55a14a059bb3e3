// The chunked KDA kernel's own code (src/cuda/kernels/kda_chunk_kernel.cuh) run on the host
// through the emulated CUDA primitives of kda_emulator.h, one host thread per CUDA thread, so
// its indexing, fragment use, swizzled tiles, phase order, barriers and numerics are checked on
// machines without a GPU (test_kda_chunk.cpp runs the same cases on a GPU). Against the double
// recurrence (kernels/kda.h), relative RMS of o and of the final state <= 1e-2: the kernel's
// products take bf16 operands (one rounding of 2^-9 relative each; the CPU kernel's bf16 mode
// measures 3.3e-3 on o, docs/kda-numerics.md), everything else is f32.
// Every case runs under three schedules (kda_emulator.h), with bitwise-equal results: threads in order and in reverse order
// with cp.async copies landing at issue (a copy into memory another thread still reads shows in
// one of them), and in reverse order with copies landing only at the wait (a read before the
// wait shows).
#include "kda_emulator.h"
// (the emulator first: it stands in for the CUDA headers)
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cuda/kernels/kda_chunk_kernel.cuh"
#include "kda_chunk_cases.h"

using namespace k3;
using namespace k3::test::kda_cases;

namespace {

constexpr double kTol = 1e-2;

enum class Schedule { Forward, Reverse, ReverseLazyCopies };

template <int DK, int DV>
void emulate_dims(float* o, float* state, const Inputs& in, int64_t t0, int64_t t1, float scale, bool dense,
                  Schedule sch) {
  const bool lazy = sch == Schedule::ReverseLazyCopies, reverse = sch != Schedule::Forward;
  const int64_t H = in.H;
  const cuda::kda::Params p{o,
                            state,
                            in.q.data() + t0 * H * DK,
                            in.k.data() + t0 * H * DK,
                            in.v.data() + t0 * H * DV,
                            in.g.data() + t0 * H * DK,
                            in.beta.data() + t0 * H,
                            t1 - t0,
                            H,
                            scale};
  const size_t bytes = cuda::kda::Layout<DK, DV>::kBytes;
  if (dense)
    emu::run_blocks(int(H), bytes, lazy, reverse, [&p] { cuda::kda::kda_chunk_kernel<DK, DV, true>(p); });
  else
    emu::run_blocks(int(H), bytes, lazy, reverse, [&p] { cuda::kda::kda_chunk_kernel<DK, DV, false>(p); });
}

// The kernel on tokens [t0, t1) of `in`; o [t1 - t0, H, Dv]; state [H, Dk, Dv] in/out or null.
void emulate(float* o, float* state, const Inputs& in, int64_t t0, int64_t t1, float scale, bool dense,
             Schedule sch) {
  if (in.Dk == 64 && in.Dv == 64) return emulate_dims<64, 64>(o, state, in, t0, t1, scale, dense, sch);
  if (in.Dk == 64 && in.Dv == 128) return emulate_dims<64, 128>(o, state, in, t0, t1, scale, dense, sch);
  if (in.Dk == 128 && in.Dv == 64) return emulate_dims<128, 64>(o, state, in, t0, t1, scale, dense, sch);
  ASSERT_TRUE(in.Dk == 128 && in.Dv == 128);
  emulate_dims<128, 128>(o, state, in, t0, t1, scale, dense, sch);
}

struct Errors {
  double o, s;
  int64_t nonfinite;
  std::vector<float> out, state;  // the kernel's o and final state
};

// One call over the whole sequence (or `pieces` calls continuing one state), compared with the
// double recurrence. Output and state poisoned (NaN) where the kernel must write them.
Errors run_case(const Inputs& in, bool dense, Schedule sch, bool with_state, const std::vector<int64_t>& pieces = {}) {
  const float scale = 1.f / std::sqrt(float(in.Dk));
  std::vector<double> sref(in.s0.begin(), in.s0.end());
  const std::vector<double> oref = reference(in, sref, scale, 0, in.T);
  std::vector<float> o(in.T * in.H * in.Dv, NAN), s = in.s0;
  std::vector<int64_t> cuts = {0};
  for (int64_t p : pieces) cuts.push_back(cuts.back() + p);
  if (cuts.back() != in.T) cuts.push_back(in.T);
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    emulate(o.data() + cuts[i] * in.H * in.Dv, with_state ? s.data() : nullptr, in, cuts[i], cuts[i + 1], scale,
            dense, sch);
  Errors e{rel_rms(o.data(), oref.data(), int64_t(oref.size())), 0, count_nonfinite(o), o, s};
  e.s = with_state ? rel_rms(s.data(), sref.data(), int64_t(sref.size())) : 0.0;
  if (!with_state)
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] != in.s0[i]) e.s = NAN;  // a null state is neither read nor written
  return e;
}

// Accurate under every schedule, and bitwise the same under all three: the kernel's reductions
// have a fixed order, so any difference, however small, is a race the schedules exposed.
void expect_accurate(const Inputs& in, bool dense, bool with_state, const std::vector<int64_t>& pieces = {}) {
  std::vector<float> first_o, first_s;
  for (Schedule sch : {Schedule::Forward, Schedule::Reverse, Schedule::ReverseLazyCopies}) {
    const Errors e = run_case(in, dense, sch, with_state, pieces);
    const char* sched[] = {"", ", reverse order", ", reverse order, copies at the wait"};
    const std::string what = std::string(dense ? "dense" : "safe") + sched[int(sch)] +
                             ", T = " + std::to_string(in.T) + ", Dk = " + std::to_string(in.Dk) +
                             ", Dv = " + std::to_string(in.Dv);
    std::printf("  %-60s rel o %.2e  rel S %.2e\n", what.c_str(), e.o, e.s);
    EXPECT_EQ(e.nonfinite, 0) << what;
    EXPECT_LE(e.o, kTol) << what;  // NaN fails too
    EXPECT_LE(e.s, kTol) << what;
    EXPECT_GT(e.o, 1e-5) << what << ": bf16 operands should leave a visible rounding error";
    if (sch == Schedule::Forward) {
      first_o = e.out, first_s = e.state;
    } else {
      EXPECT_TRUE(e.out == first_o) << what << ": o differs from the in-order schedule (a race)";
      EXPECT_TRUE(e.state == first_s) << what << ": state differs from the in-order schedule (a race)";
    }
  }
}

}  // namespace

TEST(KdaChunkEmulated, DenseFloorPinnedGateRaggedWithState) {
  expect_accurate(make_inputs(130, 2, 64, 64, Gate::FloorPinned, true, 1), true, true);
}

TEST(KdaChunkEmulated, SafeBoundedGateRaggedWithState) {
  expect_accurate(make_inputs(100, 1, 64, 64, Gate::Bounded, true, 2), false, true);
}

TEST(KdaChunkEmulated, FullWidthHeadsBothPaths) {
  const Inputs in = make_inputs(80, 1, 128, 128, Gate::FloorPinned, true, 3);
  expect_accurate(in, true, true);
  expect_accurate(in, false, true);
}

TEST(KdaChunkEmulated, MixedWidths) {
  expect_accurate(make_inputs(40, 1, 64, 128, Gate::Bounded, true, 4), true, true);
  expect_accurate(make_inputs(40, 1, 128, 64, Gate::Bounded, true, 5), false, true);
}

TEST(KdaChunkEmulated, ShortAndRaggedLengthsWithoutState) {
  for (int64_t T : {1, 15, 63, 64, 65}) expect_accurate(make_inputs(T, 1, 64, 64, Gate::Bounded, false, 6), true, false);
}

TEST(KdaChunkEmulated, PiecesContinueOneState) {
  // A prefill in pieces (ragged, a piece shorter than a sub-tile) equals one call.
  expect_accurate(make_inputs(150, 1, 64, 64, Gate::FloorPinned, true, 7), true, true, {40, 64, 9});
}

TEST(KdaChunkEmulated, UnboundedGateNeedsTheSafePath) {
  // g down to -50: the safe path stays accurate; the dense path is only valid for the bounded
  // gate (g >= -5): here its anchored factors overflow and the output is not finite.
  const Inputs in = make_inputs(96, 1, 64, 64, Gate::Unbounded, true, 8);
  expect_accurate(in, false, true);
  const Errors d = run_case(in, true, Schedule::Forward, true);
  EXPECT_TRUE(d.nonfinite > 0 || !(d.o <= 0.1)) << "dense path on the unbounded gate: rel " << d.o;
}
