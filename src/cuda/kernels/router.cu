// The router's top-k selection on the GPU (kernels/router.h router_forward after its sigmoid;
// docs/model.md section 5): one warp per token picks the k best biased scores s + b, best
// first, ties to the lower expert index and a NaN below every number (the CPU's total order),
// then weighs the selected experts by their UNBIASED scores, renormalised and scaled.
#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"

namespace k3::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxExperts = 32 * 32;  // one 32-bit "taken" mask per lane

__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

__global__ void router_topk_kernel(int32_t* idx, float* w, const float* scores, const float* bias, int64_t T, int E,
                                   int k, bool renorm, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (t >= T) return;
  const float* s = scores + t * E;
  uint32_t taken = 0;  // bit j: expert lane + 32 j selected
  for (int r = 0; r < k; ++r) {
    float best = 0.f;
    int best_e = INT32_MAX;
    for (int j = 0, e = lane; e < E; ++j, e += 32) {
      if (taken & (1u << j)) continue;
      float key = s[e] + (bias ? bias[e] : 0.f);
      if (key != key) key = -INFINITY;  // NaN ranks below every number
      if (best_e == INT32_MAX || better(key, e, best, best_e)) best = key, best_e = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (oe != INT32_MAX && (best_e == INT32_MAX || better(ob, oe, best, best_e))) best = ob, best_e = oe;
    }
    if ((best_e & 31) == lane) taken |= 1u << (best_e >> 5);
    if (lane == 0) idx[t * k + r] = best_e;
  }
  __syncwarp();
  if (lane == 0) {
    float sum = 0.f;
    for (int r = 0; r < k; ++r) sum += s[idx[t * k + r]];
    const float mul = renorm ? scale / (sum + 1e-20f) : scale;
    for (int r = 0; r < k; ++r) w[t * k + r] = s[idx[t * k + r]] * mul;
  }
}

}  // namespace

void launch_router_topk(cudaStream_t st, int32_t* idx, float* w, const float* scores, const float* bias, int64_t T,
                        int64_t E, int64_t k, bool renorm, float scale) {
  if (E > kMaxExperts) fail("CUDA router: " + std::to_string(E) + " experts (at most 1024 on the GPU)");
  K3_ASSERT(k >= 1 && k <= E, "router: top_k must lie in [1, n_experts]");
  if (T <= 0) return;
  router_topk_kernel<<<unsigned((T + kWarps - 1) / kWarps), kWarps * 32, 0, st>>>(idx, w, scores, bias, T, int(E),
                                                                                  int(k), renorm, scale);
  K3_CUDA_LAUNCHED();
}

}  // namespace k3::cuda
