// Greedy decoding on the GPU (kernels/ops.h argmax_rows): one block per row, each thread the
// best of its strided elements, then the block's best; the largest value wins, the lowest index
// among equal ones (infer/sampler.h's rule), and a NaN or an infinity anywhere flags the row.
#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace k3::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void argmax_rows_kernel(int32_t* ids, uint8_t* nonfinite, const float* logits, int64_t ld, int64_t V,
                                   const int64_t* rows) {
  const float* l = logits + rows[blockIdx.x] * ld;
  float bv = -INFINITY;
  int64_t bi = INT64_MAX;
  int bad = 0;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) {
    const float x = l[v];
    if (!isfinite(x)) {
      bad = 1;
      continue;
    }
    if (better(x, v, bv, bi)) bv = x, bi = v;
  }
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  __shared__ int sbad;
  if (threadIdx.x == 0) sbad = 0;
  __syncthreads();
  if (bad) atomicOr(&sbad, 1);
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o && better(sv[threadIdx.x + o], si[threadIdx.x + o], sv[threadIdx.x], si[threadIdx.x])) {
      sv[threadIdx.x] = sv[threadIdx.x + o];
      si[threadIdx.x] = si[threadIdx.x + o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    ids[blockIdx.x] = si[0] == INT64_MAX ? 0 : int32_t(si[0]);
    nonfinite[blockIdx.x] = uint8_t(sbad);
  }
}

}  // namespace

void launch_argmax_rows(cudaStream_t st, int32_t* ids, uint8_t* nonfinite, const float* logits, int64_t ld, int64_t V,
                        const int64_t* rows, int64_t n) {
  if (n <= 0) return;
  K3_ASSERT(n <= INT32_MAX, "argmax_rows: too many rows");
  argmax_rows_kernel<<<unsigned(n), kThreads, 0, st>>>(ids, nonfinite, logits, ld, V, rows);
  K3_CUDA_LAUNCHED();
}

}  // namespace k3::cuda
