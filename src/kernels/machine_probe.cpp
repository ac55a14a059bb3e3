// Machine-peak probes (see machine_probe.h), compiled once per SIMD target (Highway).
#include "kernels/machine_probe.h"

#include "kernels/matmul_bf16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/machine_probe.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {

// Chains: FMA latency (4-5 cycles) times 2 pipes needs about 10; 16 where 32 registers allow.
constexpr int kChains = kVecRegs == 32 ? 16 : 12;

double FmaPeakLoop(int64_t n, float* sink) {
  const DF d;
  VF acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(d, float(i) * 1e-9f);
  const VF a = hn::Set(d, 1.0000001f), b = hn::Set(d, 0.9999999f);
  for (int64_t it = 0; it < n; ++it)
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(a, acc[i], b);
  VF s = acc[0];
  for (int i = 1; i < kChains; ++i) s = hn::Add(s, acc[i]);
  *sink = HSum(d, s);
  return double(n) * kChains * 2 * double(hn::Lanes(d));
}

// The portable bf16 path's inner step per k pair: two widening ops and two FMAs per vector of
// products (kernels/matmul_bf16.cpp ukr_bf16); counted as 4 flops per lane per pair.
double WidenDotLoop(int64_t n, float* sink) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  constexpr int kC = kChains / 2;
  VF acc[kC];
  for (int i = 0; i < kC; ++i) acc[i] = hn::Zero(d);
  auto w = hn::Set(du, 0x3f803f80u);
  const VF a = hn::Set(d, 1.f);
  for (int64_t it = 0; it < n; ++it) {
    for (int i = 0; i < kC; ++i) {
      const VF lo = hn::BitCast(d, hn::ShiftLeft<16>(w)), hi = hn::BitCast(d, hn::And(w, hn::Set(du, 0xffff0000u)));
      acc[i] = hn::MulAdd(a, hi, hn::MulAdd(a, lo, acc[i]));
    }
    w = hn::Xor(w, hn::Set(du, uint32_t(it & 1)));  // keeps the widening inside the loop
  }
  VF s = acc[0];
  for (int i = 1; i < kC; ++i) s = hn::Add(s, acc[i]);
  *sink = HSum(d, s);
  return double(n) * kC * 4 * double(hn::Lanes(d));
}

float StreamSum(const float* p, int64_t n) {
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d));
  VF acc[8];
  for (auto& a : acc) a = hn::Zero(d);
  for (int64_t i = 0; i < n; i += 8 * L)
    for (int j = 0; j < 8; ++j) acc[j] = hn::Add(acc[j], hn::Load(d, p + i + L * j));
  for (int j = 1; j < 8; ++j) acc[0] = hn::Add(acc[0], acc[j]);
  return HSum(d, acc[0]);
}

int F32Lanes() { return int(hn::Lanes(DF())); }

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3 {

HWY_EXPORT(FmaPeakLoop);
HWY_EXPORT(WidenDotLoop);
HWY_EXPORT(StreamSum);
HWY_EXPORT(F32Lanes);

double bf16_dot_peak_native(int64_t n, float* sink);  // matmul_bf16_avx512bf16.cpp

double fma_peak_loop(int64_t n, float* sink) { return HWY_DYNAMIC_DISPATCH(FmaPeakLoop)(n, sink); }
double bf16_dot_peak_loop(int64_t n, float* sink) {
  return mm_bf16_native() ? bf16_dot_peak_native(n, sink) : HWY_DYNAMIC_DISPATCH(WidenDotLoop)(n, sink);
}
float stream_sum(const float* p, int64_t n) { return HWY_DYNAMIC_DISPATCH(StreamSum)(p, n); }
int dispatched_f32_lanes() { return HWY_DYNAMIC_DISPATCH(F32Lanes)(); }
int f32_lanes_of_target(int64_t t) {
  switch (t) {
    case HWY_AVX3_DL:
    case HWY_AVX3: return 16;
    case HWY_AVX2: return 8;
    case HWY_SSE4:
    case HWY_SSSE3: return 4;
    case HWY_SCALAR: return 1;
    default: return 0;
  }
}

}  // namespace k3
#endif  // HWY_ONCE
