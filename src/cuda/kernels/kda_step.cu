// KDA decode steps on the GPU (kernels/kda.h kda_recurrent_forward token by token; docs/model.md
// section 3), one sequence. Each value column j of a head's state evolves on its own given the
// token's k, q, g and beta:
//   S_a = diag(e^g) S;  u_j = S_a[:, j] . k;  p_j = S_a[:, j] . q;
//   d_j = beta (v_j - u_j);  S[:, j] = S_a[:, j] + k d_j;  o_j = scale (p_j + d_j (k . q)).
// A block takes one head and 32 value columns; its 8 warps split the key rows, each thread
// keeps its column's rows of S in registers for all the call's tokens (one read and one write
// of the state per call), and the two column sums are reduced across warps in shared memory.
#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/kernels/reduce.cuh"

namespace k3::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxRowsPerWarp = 32;  // Dk <= 256

__global__ void kda_steps_kernel(float* o, float* state, const float* q, const float* k, const float* v,
                                 const float* g, const float* beta, int64_t T, int64_t H, int64_t Dk, int64_t Dv,
                                 float scale) {
  const int64_t h = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = blockIdx.y * 32 + lane;  // value column
  const int64_t rows = (Dk + kWarps - 1) / kWarps, i0 = warp * rows;
  __shared__ float red_u[kWarps][32], red_p[kWarps][32], red_kq[kWarps];
  float* S = state + h * Dk * Dv;
  float s[kMaxRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kMaxRowsPerWarp; ++r) {
    const int64_t i = i0 + r;
    s[r] = (r < rows && i < Dk) ? S[i * Dv + j] : 0.f;
  }
  for (int64_t t = 0; t < T; ++t) {
    const int64_t base = (t * H + h) * Dk;
    const float* kt = k + base;
    const float* qt = q + base;
    const float* gt = g + base;
    float u = 0.f, p = 0.f, kq = 0.f;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int64_t i = i0 + r;
      if (r >= rows || i >= Dk) break;
      const float ki = kt[i], qi = qt[i];
      s[r] *= expf(gt[i]);
      u += s[r] * ki;
      p += s[r] * qi;
      kq += ki * qi;
    }
    red_u[warp][lane] = u;
    red_p[warp][lane] = p;
    if (lane == 0) red_kq[warp] = kq;  // every lane holds the same partial k . q
    __syncthreads();
    float U = 0.f, Pq = 0.f, KQ = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) U += red_u[w][lane], Pq += red_p[w][lane], KQ += red_kq[w];
    const float d = beta[t * H + h] * (v[(t * H + h) * Dv + j] - U);
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; ++r) {
      const int64_t i = i0 + r;
      if (r >= rows || i >= Dk) break;
      s[r] += kt[i] * d;
    }
    if (warp == 0) o[(t * H + h) * Dv + j] = scale * (Pq + d * KQ);
    __syncthreads();  // red_* are reused by the next token
  }
#pragma unroll
  for (int r = 0; r < kMaxRowsPerWarp; ++r) {
    const int64_t i = i0 + r;
    if (r >= rows || i >= Dk) break;
    S[i * Dv + j] = s[r];
  }
}

}  // namespace

void launch_kda_steps(cudaStream_t st, float* o, float* state, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, int64_t T, int64_t H, int64_t Dk, int64_t Dv, float scale) {
  if (Dk < 1 || Dk > kWarps * kMaxRowsPerWarp || Dv % 32 != 0)
    fail("CUDA KDA decode step: head dims Dk " + std::to_string(Dk) + ", Dv " + std::to_string(Dv) +
         " (Dk <= 256 and Dv a multiple of 32 are supported)");
  if (T <= 0 || H <= 0) return;
  kda_steps_kernel<<<dim3(unsigned(H), unsigned(Dv / 32)), kWarps * 32, 0, st>>>(o, state, q, k, v, g, beta, T, H, Dk,
                                                                                 Dv, scale);
  K3_CUDA_LAUNCHED();
}

}  // namespace k3::cuda
