// The SIMD target the kernels run on. Every kernel with a SIMD path is compiled once per
// Highway target (AVX3 = AVX-512 F/BW/DQ/VL, AVX2 + FMA, SSE4, and the portable baseline:
// SCALAR with Debian's GCC 12, where Highway 1.0.3 marks EMU128 broken) and picks one at
// run time through Highway's dispatch table (hwy/highway.h, HWY_DYNAMIC_DISPATCH): the best
// target this CPU supports, unless a lower one is forced.
// Forcing: the K3_SIMD_TARGET environment variable (applied before main(); a bad value exits
// with status 2 and one line on stderr), or the CLI's --simd-target flag; names are Highway's
// (avx3, avx2, sse4, scalar; "avx512" and "baseline" are accepted too), case-insensitive.
// Tests iterate over simd_targets_supported() with set_simd_target_for_test (the same
// mechanism as Highway's own per-target test macros).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

struct SimdTarget {
  int64_t bits = 0;  // Highway target bit (HWY_AVX2, ...)
  std::string name;  // Highway's name: "AVX3", "AVX2", "SSE4", "SCALAR" (or "EMU128")
};

// Targets compiled into this binary that the CPU can run, best first (the baseline last).
std::vector<SimdTarget> simd_targets_supported();
// The target the kernels dispatch to now.
SimdTarget simd_target();
// k3::Error naming the value and the choices if `name` is not a compiled target or the CPU
// cannot run it. Forcing a target disables every better one for the rest of the process.
void force_simd_target(const std::string& name, const std::string& source = "--simd-target");
// Reads K3_SIMD_TARGET (no-op when unset); k3::Error as force_simd_target.
void apply_simd_target_from_env();
// Tests: dispatch to exactly `t` (0 restores the CPU's own choice).
void set_simd_target_for_test(int64_t bits);

// The CPU's model name (cpuid brand string on x86, /proc/cpuinfo elsewhere).
std::string cpu_model_name();
// The SIMD features that matter here, e.g. "avx2 fma avx512f avx512bf16".
std::string cpu_simd_features();
// Whether the CPU executes AVX512-BF16 (vdpbf16ps), used by the hand-written bf16 tile kernel.
bool cpu_has_avx512_bf16();
// Whether the kernels may use AVX-512 now (the CPU has it and no lower target is forced);
// cheap (cached), for per-call checks of hand-written AVX-512 paths.
bool simd_avx512_allowed();
// One line for logs: "CPU AMD EPYC [avx2 fma]; kernels AVX2 (supported: AVX2 SSE4 SCALAR)".
std::string machine_summary();

}  // namespace k3
