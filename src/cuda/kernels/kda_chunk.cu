// launch_kda_chunk (cuda/kernels.h): checks the shape and pointers, picks the kernel instance
// (kda_chunk_kernel.cuh) for Dk, Dv in {64, 128} and the diagonal path, and launches one block
// per head with the shared memory the instance needs (docs/cuda-kda.md).
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/kernels/kda_chunk_kernel.cuh"

namespace k3::cuda {
namespace kda {
namespace {

// Hopper's 232,448 bytes of shared memory per block hold every instance (docs/cuda-kda.md).
static_assert(Layout<128, 128>::kBytes <= 232448 && Layout<128, 64>::kBytes <= 232448, "too much shared memory");

template <int DK, int DV, bool DENSE>
void launch(cudaStream_t st, const Params& p) {
  const size_t bytes = Layout<DK, DV>::kBytes;
  int dev = 0, optin = 0;
  K3_CUDA_CHECK(cudaGetDevice(&dev));
  K3_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > size_t(optin))
    fail("launch_kda_chunk: Dk = " + std::to_string(DK) + ", Dv = " + std::to_string(DV) + " needs " +
         std::to_string(bytes) + " bytes of shared memory per block; this GPU allows " + std::to_string(optin) +
         " (Hopper: 232448)");
  auto* kern = kda_chunk_kernel<DK, DV, DENSE>;
  K3_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  kern<<<unsigned(p.H), kThreads, bytes, st>>>(p);
  K3_CUDA_LAUNCHED();
}

template <int DK, int DV>
void launch_dv(cudaStream_t st, const Params& p, bool dense) {
  if (dense)
    launch<DK, DV, true>(st, p);
  else
    launch<DK, DV, false>(st, p);
}

bool aligned(const void* x, size_t a) { return reinterpret_cast<uintptr_t>(x) % a == 0; }

}  // namespace
}  // namespace kda

void launch_kda_chunk(cudaStream_t st, float* o, float* state, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, int64_t T, int64_t H, int64_t Dk, int64_t Dv, float scale,
                      bool diag_dense) {
  using namespace kda;
  if (!((Dk == 64 || Dk == 128) && (Dv == 64 || Dv == 128)))
    fail("launch_kda_chunk: Dk = " + std::to_string(Dk) + ", Dv = " + std::to_string(Dv) +
         ": the CUDA chunked KDA supports Dk and Dv in {64, 128}");
  if (T < 0 || H < 1 || H > 0x7fffffff)
    fail("launch_kda_chunk: bad shape T = " + std::to_string(T) + ", H = " + std::to_string(H));
  if (T == 0) return;
  if (!o || !q || !k || !v || !g || !beta) fail("launch_kda_chunk: null input or output pointer");
  if (!aligned(q, 16) || !aligned(k, 16) || !aligned(g, 16) || !aligned(v, 16) || !aligned(o, 8) ||
      !aligned(beta, 4) || (state && !aligned(state, 8)))
    fail("launch_kda_chunk: q, k, g, v must be 16-byte aligned, o and state 8-byte aligned");
  const Params p{o, state, q, k, v, g, beta, T, H, scale};
  if (Dk == 64) {
    if (Dv == 64)
      launch_dv<64, 64>(st, p, diag_dense);
    else
      launch_dv<64, 128>(st, p, diag_dense);
  } else {
    if (Dv == 64)
      launch_dv<128, 64>(st, p, diag_dense);
    else
      launch_dv<128, 128>(st, p, diag_dense);
  }
}

}  // namespace k3::cuda
