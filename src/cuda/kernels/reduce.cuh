// Warp and block reductions shared by the CUDA kernels.
#pragma once

namespace k3::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum of v over the block, returned to every thread. Every thread of the block must call it
// (it synchronises); consecutive calls are safe (the leading barrier keeps a warp from
// overwriting the partial sums another warp is still reading).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : 0.f;
  return warp_sum(v);
}

}  // namespace k3::cuda
