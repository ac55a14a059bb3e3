// Which OpenBLAS kernel set the large products run on. OpenBLAS chooses its kernels from the
// CPU on its own (DYNAMIC_ARCH: Cooperlake, with AVX-512, on a Zen 5), so forcing a lower
// SIMD target (core/simd_target.h) would still run AVX-512 inside every large product; this
// makes OpenBLAS follow the forced target, so that a forced AVX2 run executes no AVX-512 at all.
#pragma once
#include <string>

namespace k3 {

// Once, before the first OpenBLAS product (k3::gemm calls it): if a target below AVX-512 is
// forced on an AVX-512 CPU and OpenBLAS picked an AVX-512 set, switch OpenBLAS to its Haswell
// (AVX2) kernels, through gotoblas_dynamic_quit / _init, the re-selection OpenBLAS's
// DYNAMIC_ARCH builds export. Nothing changes when the process was started with
// OPENBLAS_CORETYPE (the user's choice) or OpenBLAS cannot re-select.
void blas_choose_core();
// Whether this OpenBLAS can re-select its kernels and the user left the choice to us.
bool blas_core_selectable();
// The kernel set OpenBLAS runs now ("SkylakeX", "Haswell", ...).
std::string blas_core_name();
// Whether a kernel set of that name uses AVX-512 (SkylakeX, Cooperlake, SapphireRapids).
bool blas_core_is_avx512(const std::string& name);

}  // namespace k3
