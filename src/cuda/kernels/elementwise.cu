// Elementwise and row-wise kernels of the CUDA backend (see cuda/kernels.h for each contract and
// its CPU reference). Memory-bound: grid-stride loops over elements, one block per row for the
// norms (a row's sum of squares reduced across the block in f32).
#include <cuda_bf16.h>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/kernels/reduce.cuh"

namespace k3::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void sigmoid_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = sigmoidf_(x[i]);
}

__global__ void mul_sigmoid_kernel(float* y, const float* a, const float* g, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] * sigmoidf_(g[i]);
}

__global__ void scale_kernel(float* x, float f, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= f;
}

__global__ void fill_kernel(float* x, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}

__global__ void copy_rows_kernel(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[r * ldd + c] = src[r * lds + c];
  }
}

// One block per row: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
__global__ void rmsnorm_kernel(float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx, const float* w,
                               int64_t dim, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * ldx;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float s = 1.f / sqrtf(ss / float(dim) + eps);
  if (rstd && threadIdx.x == 0) rstd[r] = s;
  float* yr = y + r * ldy;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w ? xr[i] * s * w[i] : xr[i] * s;
}

// One warp per row: y = x / sqrt(sum x^2 + eps).
__global__ void l2norm_kernel(float* y, float* inv, const float* x, int64_t rows, int64_t dim, float eps) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float* xr = x + r * dim;
  float ss = 0.f;
  for (int64_t i = lane; i < dim; i += 32) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  const float s = 1.f / sqrtf(ss + eps);
  if (inv && lane == 0) inv[r] = s;
  float* yr = y + r * dim;
  for (int64_t i = lane; i < dim; i += 32) yr[i] = xr[i] * s;
}

__global__ void situ_glu_kernel(float* act, const float* gu, int64_t rows, int64_t F, float b1, float b2) {
  const int64_t n = rows * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i - r * F;
    const float g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j];
    act[i] = b1 * tanhf(g / b1) * sigmoidf_(g) * b2 * tanhf(u / b2);
  }
}

__global__ void kda_gate_kernel(float* g, const float* z, const float* A_log, const float* dt_bias, int64_t T,
                                int64_t H, int64_t D, bool bounded, float lb) {
  const int64_t HD = H * D, n = T * HD;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % HD, h = c / D;
    const float a = expf(A_log[h]);  // one decay rate per head
    const float u = z[i] + dt_bias[c];
    if (bounded) {
      g[i] = lb * sigmoidf_(a * u);
    } else {
      const float sp = u > 20.f ? u : log1pf(expf(u));
      g[i] = -a * sp;
    }
  }
}

// One thread per (token, channel): pre = sum_j w[c, j] x_ext[t - (K-1) + j] over the carried
// state and x, y = SiLU(pre). The new state is written by the next kernel (stream order: after
// every read of the old one).
__global__ void shortconv_silu_kernel(float* y, float* pre, const float* state, const float* x, const float* w,
                                      int64_t T, int64_t C, int64_t K) {
  const int64_t n = T * C, P = K - 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    float acc = 0.f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t src = t - P + j;  // < 0: a carried input
      acc += w[c * K + j] * (src >= 0 ? x[src * C + c] : state[c * P + P + src]);
    }
    if (pre) pre[i] = acc;
    y[i] = acc * sigmoidf_(acc);
  }
}

// state [C, P] = the last P entries of [state | x] per channel, oldest first.
__global__ void shortconv_state_kernel(float* state, const float* x, int64_t T, int64_t C, int64_t P) {
  const int64_t n = C * P;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i / P, j = i - c * P;
    const int64_t src = T - P + j;
    state[i] = x[src * C + c];  // T >= P: every new entry comes from x
  }
}

// T < P: the state shifts by T, then takes the T new inputs (one thread per channel, in order).
__global__ void shortconv_shift_kernel(float* state, const float* x, int64_t T, int64_t C, int64_t P) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float* st = state + c * P;
  for (int64_t j = 0; j < P - T; ++j) st[j] = st[j + T];
  for (int64_t j = 0; j < T; ++j) st[P - T + j] = x[j * C + c];
}

struct Sources {
  const float* p[kMaxAttnResSources];
};

// One block per token: scores over the sources (each a block-wide dot and sum of squares),
// softmax, the weighted sum over the raw sources.
__global__ void attn_res_kernel(float* out, float* alpha, Sources src, int S, const float* w_norm,
                                const float* w_proj, int64_t d, float eps) {
  const int64_t t = blockIdx.x;
  __shared__ float a[kMaxAttnResSources];
  for (int s = 0; s < S; ++s) {
    const float* x = src.p[s] + t * d;
    float ss = 0.f, dot = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float v = x[i];
      ss += v * v;
      dot += w_proj[i] * w_norm[i] * v;
    }
    ss = block_sum(ss);
    dot = block_sum(dot);
    if (threadIdx.x == 0) a[s] = dot / sqrtf(ss / float(d) + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    for (int s = 0; s < S; ++s) mx = fmaxf(mx, a[s]);
    float sum = 0.f;
    for (int s = 0; s < S; ++s) sum += (a[s] = expf(a[s] - mx));
    for (int s = 0; s < S; ++s) a[s] /= sum;
    if (alpha)
      for (int s = 0; s < S; ++s) alpha[t * S + s] = a[s];
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float o = a[0] * src.p[0][t * d + i];
    for (int s = 1; s < S; ++s) o += a[s] * src.p[s][t * d + i];
    out[t * d + i] = o;
  }
}

__global__ void embed_rows_kernel(float* dst, const float* Wf, const __nv_bfloat16* Wb, const int32_t* ids, int64_t T,
                                  int64_t d) {
  const int64_t n = T * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, c = i - t * d;
    const int64_t row = ids[t];
    dst[i] = Wf ? Wf[row * d + c] : __bfloat162float(Wb[row * d + c]);
  }
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

}  // namespace

void launch_add(cudaStream_t st, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, st>>>(y, x, n);
  K3_CUDA_LAUNCHED();
}

void launch_sigmoid(cudaStream_t st, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  sigmoid_kernel<<<blocks_for(n), kThreads, 0, st>>>(y, x, n);
  K3_CUDA_LAUNCHED();
}

void launch_mul_sigmoid(cudaStream_t st, float* y, const float* a, const float* g, int64_t n) {
  if (n <= 0) return;
  mul_sigmoid_kernel<<<blocks_for(n), kThreads, 0, st>>>(y, a, g, n);
  K3_CUDA_LAUNCHED();
}

void launch_scale(cudaStream_t st, float* x, float f, int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, st>>>(x, f, n);
  K3_CUDA_LAUNCHED();
}

void launch_fill(cudaStream_t st, float* x, float v, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, st>>>(x, v, n);
  K3_CUDA_LAUNCHED();
}

void launch_copy_rows(cudaStream_t st, float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows,
                      int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  copy_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, st>>>(dst, ldd, src, lds, rows, cols);
  K3_CUDA_LAUNCHED();
}

void launch_rmsnorm(cudaStream_t st, float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx, const float* w,
                    int64_t rows, int64_t dim, float eps) {
  if (rows <= 0) return;
  K3_ASSERT(rows <= INT32_MAX, "rmsnorm: too many rows for one launch");
  rmsnorm_kernel<<<unsigned(rows), kThreads, 0, st>>>(y, ldy, rstd, x, ldx, w, dim, eps);
  K3_CUDA_LAUNCHED();
}

void launch_l2norm(cudaStream_t st, float* y, float* inv, const float* x, int64_t rows, int64_t dim, float eps) {
  if (rows <= 0) return;
  const int64_t per_block = kThreads / 32;
  l2norm_kernel<<<unsigned((rows + per_block - 1) / per_block), kThreads, 0, st>>>(y, inv, x, rows, dim, eps);
  K3_CUDA_LAUNCHED();
}

void launch_situ_glu(cudaStream_t st, float* act, const float* gu, int64_t rows, int64_t F, float b1, float b2) {
  if (rows * F <= 0) return;
  situ_glu_kernel<<<blocks_for(rows * F), kThreads, 0, st>>>(act, gu, rows, F, b1, b2);
  K3_CUDA_LAUNCHED();
}

void launch_kda_gate(cudaStream_t st, float* g, const float* z, const float* A_log, const float* dt_bias, int64_t T,
                     int64_t H, int64_t D, bool bounded, float lower_bound) {
  if (T * H * D <= 0) return;
  kda_gate_kernel<<<blocks_for(T * H * D), kThreads, 0, st>>>(g, z, A_log, dt_bias, T, H, D, bounded, lower_bound);
  K3_CUDA_LAUNCHED();
}

void launch_shortconv_silu(cudaStream_t st, float* y, float* pre, float* state, const float* x, const float* w,
                           int64_t T, int64_t C, int64_t K) {
  K3_ASSERT(K >= 1, "short conv kernel size must be >= 1");
  if (C <= 0 || T <= 0) return;
  shortconv_silu_kernel<<<blocks_for(T * C), kThreads, 0, st>>>(y, pre, state, x, w, T, C, K);
  K3_CUDA_LAUNCHED();
  const int64_t P = K - 1;
  if (P == 0) return;
  if (T >= P) {
    shortconv_state_kernel<<<blocks_for(C * P), kThreads, 0, st>>>(state, x, T, C, P);
  } else {
    shortconv_shift_kernel<<<unsigned((C + kThreads - 1) / kThreads), kThreads, 0, st>>>(state, x, T, C, P);
  }
  K3_CUDA_LAUNCHED();
}

void launch_attn_res(cudaStream_t st, float* out, float* alpha, const float* const* sources, int64_t S,
                     const float* w_norm, const float* w_proj, int64_t T, int64_t d, float eps) {
  if (S < 1 || S > kMaxAttnResSources)
    fail("CUDA AttnRes read: " + std::to_string(S) + " sources (at most " + std::to_string(kMaxAttnResSources) + ")");
  if (T <= 0) return;
  Sources src{};
  for (int64_t s = 0; s < S; ++s) src.p[s] = sources[s];
  attn_res_kernel<<<unsigned(T), kThreads, 0, st>>>(out, alpha, src, int(S), w_norm, w_proj, d, eps);
  K3_CUDA_LAUNCHED();
}

void launch_embed_rows(cudaStream_t st, float* dst, const float* W_f32, const uint16_t* W_bf16, const int32_t* ids,
                       int64_t T, int64_t d) {
  if (T * d <= 0) return;
  embed_rows_kernel<<<blocks_for(T * d), kThreads, 0, st>>>(dst, W_f32,
                                                            reinterpret_cast<const __nv_bfloat16*>(W_bf16), ids, T, d);
  K3_CUDA_LAUNCHED();
}

void launch_f32_to_bf16(cudaStream_t st, uint16_t* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, st>>>(reinterpret_cast<__nv_bfloat16*>(dst), src, n);
  K3_CUDA_LAUNCHED();
}

}  // namespace k3::cuda
