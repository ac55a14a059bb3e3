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

}  // namespace k3
