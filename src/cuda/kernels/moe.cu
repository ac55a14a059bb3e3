// Routed SiTU-GLU experts on the GPU (kernels/moe.h moe_experts_forward; docs/model.md section
// 5), with MXFP4 weights read as stored and decoded in registers (no dequantised copy in device
// memory; docs/model.md section 8), or f32 weights:
//   1. count the (token, slot) assignments per expert, scan them, list the active experts;
//   2. scatter each assignment to its expert's range (the order inside an expert does not
//      matter: every row is computed on its own);
//   3. act = SiTU(W1 z, W3 z) for every row of every active expert: one warp per weight row,
//      each lane one 32-value group (one scale byte, 16 packed bytes) at a time, against a
//      group of the expert's rows;
//   4. y = W2 act likewise;
//   5. u[t] = sum_i w[t, i] y[row of (t, i)], summed in slot order (deterministic).
// Weight bytes are read once per group of rows: decode (a row or two per expert) reads each
// active expert once. Prefill re-reads them per group of kRows rows from L2; a tensor-core
// grouped GEMM for long prompts is future work (docs/benchmarks.md, CUDA section).
#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/kernels/reduce.cuh"

namespace k3::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;  // weight rows per warp
constexpr int kRows = 8;         // activation rows per pass over a weight row

__constant__ float kE2M1Dev[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(s - 127) (s = 255: NaN; s = 0: 2^-127, subnormal), as core/dtype.h e8m0_to_f32.
__device__ __forceinline__ float e8m0(uint8_t s) {
  if (s == 255) return __int_as_float(0x7fc00000);
  return __uint_as_float(s == 0 ? 0x00400000u : uint32_t(s) << 23);
}

struct Workspace {
  int32_t* counts;     // [E]
  int32_t* offsets;    // [E + 1]
  int32_t* cursor;     // [E]
  int32_t* active;     // [E] active experts, ascending
  int32_t* n_active;   // [1]
  int32_t* row_tok;    // [T k] token of each dispatched row
  int32_t* slot_row;   // [T k] dispatched row of each (token, slot)
  float* act;          // [T k, F]
  float* y;            // [T k, n_in]
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

Workspace carve(void* base, int64_t T, int64_t n_in, int64_t F, int64_t E, int64_t k) {
  char* p = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* r = p;
    p += align256(bytes);
    return r;
  };
  Workspace w;
  w.counts = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(E)));
  w.offsets = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(E + 1)));
  w.cursor = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(E)));
  w.active = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(E)));
  w.n_active = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  w.row_tok = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(T * k)));
  w.slot_row = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * size_t(T * k)));
  w.act = reinterpret_cast<float*>(take(sizeof(float) * size_t(T * k * F)));
  w.y = reinterpret_cast<float*>(take(sizeof(float) * size_t(T * k * n_in)));
  return w;
}

__global__ void count_kernel(int32_t* counts, const int32_t* idx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&counts[idx[i]], 1);
}

// One block: offsets = exclusive scan of counts, cursor = offsets, the active list in order.
__global__ void scan_kernel(Workspace w, int E) {
  __shared__ int32_t carry, carry_active;
  __shared__ int32_t buf[1024], flag[1024];
  if (threadIdx.x == 0) carry = 0, carry_active = 0;
  __syncthreads();
  for (int base = 0; base < E; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const int c = e < E ? w.counts[e] : 0;
    buf[threadIdx.x] = c;
    flag[threadIdx.x] = c > 0;
    __syncthreads();
    // Inclusive Hillis-Steele scans of the counts and of the active flags.
    for (int o = 1; o < blockDim.x; o <<= 1) {
      const int a = threadIdx.x >= o ? buf[threadIdx.x - o] : 0;
      const int f = threadIdx.x >= o ? flag[threadIdx.x - o] : 0;
      __syncthreads();
      buf[threadIdx.x] += a;
      flag[threadIdx.x] += f;
      __syncthreads();
    }
    if (e < E) {
      const int off = carry + buf[threadIdx.x] - c;
      w.offsets[e] = off;
      w.cursor[e] = off;
      if (c > 0) w.active[carry_active + flag[threadIdx.x] - 1] = e;
    }
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) {
      carry += buf[threadIdx.x];
      carry_active += flag[threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    w.offsets[E] = carry;
    *w.n_active = carry_active;
  }
}

__global__ void scatter_kernel(Workspace w, const int32_t* idx, int64_t T, int64_t k) {
  const int64_t n = T * k;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t row = atomicAdd(&w.cursor[idx[i]], 1);
    w.row_tok[row] = int32_t(i / k);
    w.slot_row[i] = row;
  }
}

// Dot products of one weight row with kRows activation rows, accumulated per lane: each lane
// takes 32-value groups lane, lane + 32, ... of the row.
template <bool kMx>
__device__ __forceinline__ void row_dots(float (&acc)[kRows], const float* wf, const uint8_t* wp, const uint8_t* ws,
                                         int64_t K, const float* const (&x)[kRows], int nrows, int lane) {
  const int64_t groups = K / 32;
  for (int64_t gi = lane; gi < groups; gi += 32) {
    float wv[32];
    if constexpr (kMx) {
      const uint4 u = *reinterpret_cast<const uint4*>(wp + gi * 16);
      const float sc = e8m0(ws[gi]);
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const uint32_t byte = (words[q] >> (8 * b)) & 0xffu;
          wv[8 * q + 2 * b] = kE2M1Dev[byte & 0xf] * sc;  // low nibble: the even element
          wv[8 * q + 2 * b + 1] = kE2M1Dev[byte >> 4] * sc;
        }
    } else {
#pragma unroll
      for (int j = 0; j < 32; j += 4) {
        const float4 f = *reinterpret_cast<const float4*>(wf + gi * 32 + j);
        wv[j] = f.x, wv[j + 1] = f.y, wv[j + 2] = f.z, wv[j + 3] = f.w;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= nrows) break;
      const float* xr = x[r] + gi * 32;
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 32; j += 4) {
        const float4 f = *reinterpret_cast<const float4*>(xr + j);
        s += wv[j] * f.x + wv[j + 1] * f.y + wv[j + 2] * f.z + wv[j + 3] * f.w;
      }
      acc[r] += s;
    }
  }
}

// Expert active[blockIdx.y], weight rows [blockIdx.x * kWarps * kRowsPerWarp, ...):
// gate_up: act[row, f] = SiTU(W1[f] . z[tok(row)], W3[f] . z[tok(row)]), f < F, K = n_in;
// down:    y[row, c] = W2[c] . act[row], c < n_in, K = F.
template <bool kMx, bool kGateUp>
__global__ void experts_kernel(Workspace w, const float* z, ExpertTable t1, ExpertTable t3, int64_t out_rows,
                               int64_t K, float b1, float b2, int64_t F, int64_t n_in) {
  if (int(blockIdx.y) >= *w.n_active) return;
  const int e = w.active[blockIdx.y];
  const int lane = threadIdx.x & 31;
  const int64_t begin = w.offsets[e], end = w.offsets[e + 1];
  const int64_t r0 = (blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5)) * kRowsPerWarp;
  for (int64_t wr = r0; wr < r0 + kRowsPerWarp && wr < out_rows; ++wr) {
    const float* w1f = kMx ? nullptr : t1.f32[e] + wr * K;
    const uint8_t* w1p = kMx ? t1.packed[e] + wr * (K / 2) : nullptr;
    const uint8_t* w1s = kMx ? t1.scales[e] + wr * (K / 32) : nullptr;
    const float* w3f = nullptr;
    const uint8_t *w3p = nullptr, *w3s = nullptr;
    if (kGateUp) {
      w3f = kMx ? nullptr : t3.f32[e] + wr * K;
      w3p = kMx ? t3.packed[e] + wr * (K / 2) : nullptr;
      w3s = kMx ? t3.scales[e] + wr * (K / 32) : nullptr;
    }
    for (int64_t row = begin; row < end; row += kRows) {
      const int nrows = int(min(int64_t(kRows), end - row));
      const float* x[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t rr = row + (r < nrows ? r : 0);
        x[r] = kGateUp ? z + int64_t(w.row_tok[rr]) * n_in : w.act + rr * F;
      }
      float a1[kRows], a3[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) a1[r] = a3[r] = 0.f;
      row_dots<kMx>(a1, w1f, w1p, w1s, K, x, nrows, lane);
      if (kGateUp) row_dots<kMx>(a3, w3f, w3p, w3s, K, x, nrows, lane);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= nrows) break;
        const float g = warp_sum(a1[r]);
        if (kGateUp) {
          const float u = warp_sum(a3[r]);
          if (lane == 0) {
            const float sg = 1.f / (1.f + expf(-g));
            w.act[(row + r) * F + wr] = b1 * tanhf(g / b1) * sg * b2 * tanhf(u / b2);
          }
        } else if (lane == 0) {
          w.y[(row + r) * n_in + wr] = g;
        }
      }
    }
  }
}

// u[t, c] = sum_i w[t, i] y[slot_row[t k + i], c], in slot order.
__global__ void combine_kernel(float* u, const float* wts, Workspace w, int64_t T, int64_t k, int64_t n_in) {
  const int64_t n = T * n_in;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / n_in, c = i - t * n_in;
    float acc = 0.f;
    for (int64_t s = 0; s < k; ++s) acc += wts[t * k + s] * w.y[int64_t(w.slot_row[t * k + s]) * n_in + c];
    u[i] = acc;
  }
}

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

}  // namespace

size_t moe_workspace_bytes(int64_t T, int64_t n_in, int64_t F, int64_t E, int64_t k) {
  const size_t i4 = sizeof(int32_t), f4 = sizeof(float);
  return align256(i4 * size_t(E)) * 4 + align256(i4 * size_t(E + 1)) + align256(i4) + align256(i4 * size_t(T * k)) * 2 +
         align256(f4 * size_t(T * k * F)) + align256(f4 * size_t(T * k * n_in));
}

void launch_moe_experts(cudaStream_t st, float* u, const float* z, const int32_t* idx, const float* wts,
                        const ExpertTable& w1, const ExpertTable& w3, const ExpertTable& w2, int64_t T, int64_t n_in,
                        int64_t F, int64_t E, int64_t k, float b1, float b2, void* ws) {
  if (T <= 0) return;
  if (n_in % 32 != 0 || F % 32 != 0)
    fail("CUDA routed experts: widths " + std::to_string(n_in) + " and " + std::to_string(F) +
         " must be multiples of 32");
  const bool mx = w1.packed != nullptr;
  K3_ASSERT(mx ? (w3.packed && w2.packed) : (w1.f32 && w3.f32 && w2.f32), "CUDA routed experts: mixed formats");
  const Workspace w = carve(ws, T, n_in, F, E, k);
  K3_CUDA_CHECK(cudaMemsetAsync(w.counts, 0, sizeof(int32_t) * size_t(E), st));
  count_kernel<<<blocks_for(T * k), 256, 0, st>>>(w.counts, idx, T * k);
  K3_CUDA_LAUNCHED();
  scan_kernel<<<1, 1024, 0, st>>>(w, int(E));
  K3_CUDA_LAUNCHED();
  scatter_kernel<<<blocks_for(T * k), 256, 0, st>>>(w, idx, T, k);
  K3_CUDA_LAUNCHED();
  const int64_t max_active = std::min(E, T * k);
  const int64_t rows_per_block = kWarps * kRowsPerWarp;
  const dim3 gu_grid(unsigned((F + rows_per_block - 1) / rows_per_block), unsigned(max_active));
  const dim3 dn_grid(unsigned((n_in + rows_per_block - 1) / rows_per_block), unsigned(max_active));
  if (mx) {
    experts_kernel<true, true><<<gu_grid, kWarps * 32, 0, st>>>(w, z, w1, w3, F, n_in, b1, b2, F, n_in);
    K3_CUDA_LAUNCHED();
    experts_kernel<true, false><<<dn_grid, kWarps * 32, 0, st>>>(w, z, w2, w2, n_in, F, b1, b2, F, n_in);
  } else {
    experts_kernel<false, true><<<gu_grid, kWarps * 32, 0, st>>>(w, z, w1, w3, F, n_in, b1, b2, F, n_in);
    K3_CUDA_LAUNCHED();
    experts_kernel<false, false><<<dn_grid, kWarps * 32, 0, st>>>(w, z, w2, w2, n_in, F, b1, b2, F, n_in);
  }
  K3_CUDA_LAUNCHED();
  combine_kernel<<<blocks_for(T * n_in), 256, 0, st>>>(u, wts, w, T, k, n_in);
  K3_CUDA_LAUNCHED();
}

}  // namespace k3::cuda
