// Machine-peak probes for the benchmarks, on the SIMD target the kernels dispatch to, so that
// "% of FMA peak" and "% of memory bandwidth" are taken against what the dispatched code can
// reach (AVX2 code on an AVX2 machine, or the target forced with K3_SIMD_TARGET).
#pragma once
#include <cstdint>

namespace k3 {

// n iterations of independent FMA chains held in registers (as many as the target needs to
// cover the FMA latency); returns the floating-point operations done (2 per lane per FMA).
// *sink receives a value that depends on every chain (keep it, so nothing is optimised away).
double fma_peak_loop(int64_t n, float* sink);
// The same for the bf16 dot product the bf16 tile kernel uses: vdpbf16ps where the CPU has
// AVX512-BF16 and AVX-512 is not disabled, else the widening FMAs of the portable path.
double bf16_dot_peak_loop(int64_t n, float* sink);
// Sum of n floats (p 64-byte aligned, n a multiple of 128) with independent accumulators, so
// that loads, not the add latency, bound the loop.
float stream_sum(const float* p, int64_t n);
// The f32 vector width of the code the kernels dispatch to right now (16 AVX-512, 8 AVX2,
// 4 SSE4, 1 scalar): what actually runs, for the tests that switch targets.
int dispatched_f32_lanes();
// The lane count a target's f32 vectors have (0 for a target this build does not know).
int f32_lanes_of_target(int64_t target_bits);

}  // namespace k3
