// Few-row products C = alpha A B^T + beta C with B [N, K] as held (f32, or bf16 widened in
// registers), f32 accumulation (see cuda/kernels.h launch_gemv_nt). Decode steps multiply a few
// rows by every weight matrix: the bytes of B are the whole cost, so each warp streams one row
// of B once (16-byte loads) against all M rows of A (read from L1/L2, shared by the block's
// warps), and reduces its M partial sums across lanes at the end.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/kernels/reduce.cuh"

namespace k3::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxM = int(kCudaGemvMaxRows);

// 8 consecutive B values as f32.
__device__ __forceinline__ void load8(float (&b)[8], const float* Bf, const __nv_bfloat16* Bb, int64_t k) {
  if (Bf) {
    const float4 lo = *reinterpret_cast<const float4*>(Bf + k), hi = *reinterpret_cast<const float4*>(Bf + k + 4);
    b[0] = lo.x, b[1] = lo.y, b[2] = lo.z, b[3] = lo.w, b[4] = hi.x, b[5] = hi.y, b[6] = hi.z, b[7] = hi.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(Bb + k);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // bf16 -> f32 is the high half of the f32 bits
      b[2 * i] = __uint_as_float(w[i] << 16);
      b[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

__device__ __forceinline__ float load1(const float* Bf, const __nv_bfloat16* Bb, int64_t k) {
  return Bf ? Bf[k] : __bfloat162float(Bb[k]);
}

// One warp per output column n of product blockIdx.y. vec: 16-byte loads (K % 8 == 0 and every
// row start 16-byte aligned, checked by the launcher); else one element per lane at a time.
template <bool vec>
__global__ void gemv_nt_kernel(int M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, int64_t sA,
                               const float* Bf, const __nv_bfloat16* Bb, int64_t ldb, int64_t sB, float beta, float* C,
                               int64_t ldc, int64_t sC) {
  const int lane = threadIdx.x & 31;
  const int64_t n = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (n >= N) return;
  const int64_t p = blockIdx.y;
  A += p * sA;
  C += p * sC;
  const float* bf = Bf ? Bf + p * sB + n * ldb : nullptr;
  const __nv_bfloat16* bb = Bb ? Bb + p * sB + n * ldb : nullptr;
  float acc[kMaxM];
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) acc[m] = 0.f;
  if (vec) {
    for (int64_t k = int64_t(lane) * 8; k < K; k += 32 * 8) {
      float b[8];
      load8(b, bf, bb, k);
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
        if (m >= M) break;
        const float* a = A + m * lda + k;
        const float4 lo = *reinterpret_cast<const float4*>(a), hi = *reinterpret_cast<const float4*>(a + 4);
        acc[m] += lo.x * b[0] + lo.y * b[1] + lo.z * b[2] + lo.w * b[3] + hi.x * b[4] + hi.y * b[5] + hi.z * b[6] +
                  hi.w * b[7];
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
      const float b = load1(bf, bb, k);
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
        if (m >= M) break;
        acc[m] += A[m * lda + k] * b;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) {
    if (m >= M) break;
    const float s = warp_sum(acc[m]);
    if (lane == 0) {
      float* c = C + m * ldc + n;
      *c = beta == 0.f ? alpha * s : alpha * s + beta * *c;
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void launch_gemv_nt(cudaStream_t st, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const float* B_f32, const uint16_t* B_bf16, int64_t ldb, int64_t sB, float beta,
                    float* C, int64_t ldc, int64_t sC, int64_t count) {
  K3_ASSERT(M >= 1 && M <= kCudaGemvMaxRows, "launch_gemv_nt: M out of range");
  K3_ASSERT((B_f32 == nullptr) != (B_bf16 == nullptr), "launch_gemv_nt: B must be f32 or bf16");
  if (N <= 0 || count <= 0) return;
  const auto* Bb = reinterpret_cast<const __nv_bfloat16*>(B_bf16);
  const int64_t b_align = B_f32 ? 4 : 8;  // elements per 16 bytes
  const bool vec = K % 8 == 0 && lda % 4 == 0 && sA % 4 == 0 && aligned16(A) && ldb % b_align == 0 &&
                   sB % b_align == 0 && (B_f32 ? aligned16(B_f32) : aligned16(B_bf16));
  const dim3 grid(unsigned((N + kWarps - 1) / kWarps), unsigned(count));
  if (vec)
    gemv_nt_kernel<true><<<grid, kWarps * 32, 0, st>>>(int(M), N, K, alpha, A, lda, sA, B_f32, Bb, ldb, sB, beta, C,
                                                       ldc, sC);
  else
    gemv_nt_kernel<false><<<grid, kWarps * 32, 0, st>>>(int(M), N, K, alpha, A, lda, sA, B_f32, Bb, ldb, sB, beta, C,
                                                        ldc, sC);
  K3_CUDA_LAUNCHED();
}

}  // namespace k3::cuda
