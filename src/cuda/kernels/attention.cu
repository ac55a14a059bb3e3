// Causal softmax attention on the GPU (kernels/attention.h attention_forward; docs/model.md
// section 4), f32, with the online softmax of flash attention and a split over keys:
//   rows: the (query, head) pairs that share one kv head, Tq x (H / Hkv) of them; a block takes
//         kRows rows of one kv head and one range of keys, stages kKeys keys (and the shared
//         k_rope part) in shared memory at a time, and keeps each row's running max, sum and
//         output;
//   split: the keys of a long prefix are cut into ranges so that a decode step (a few rows,
//         thousands of keys) still fills the GPU; the ranges' partial results are merged by a
//         second kernel with their log-sum-exps.
// Absorbed MLA decode is Hkv = 1: all 96 heads of a token are rows of the same blocks, and the
// latent cache is read once per block instead of once per head. Tensor cores for prefill are
// future work (docs/benchmarks.md, CUDA section).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/kernels/reduce.cuh"

namespace k3::cuda {

namespace {

constexpr int kRows = 16;     // (query, head) rows per block
constexpr int kKeys = 32;     // keys staged per step
constexpr int kThreads = 256;
constexpr int kMaxDv = 512;   // output columns per row: kMaxDv / 16 per thread
constexpr int64_t kSplitKeys = 512;  // keys per split range

struct Geometry {
  int64_t Tq, P, H, Hkv, Dk, Dr, Dv, group;  // group = H / Hkv
  float scale;
  int64_t q_tok, q_head, k_tok, k_head, kr_tok, v_tok, v_head, o_tok, o_head;
};

// Row r of kv head `kvh`: query i = r / group, head h = kvh * group + r % group.
__device__ __forceinline__ void row_of(const Geometry& g, int64_t kvh, int64_t r, int64_t& i, int64_t& h) {
  i = r / g.group;
  h = kvh * g.group + r % g.group;
}

// grid: (row tiles, Hkv, splits). Partial results of split s for row r go to part[(s, kvh, r)]:
// [Dv] output (unnormalised), then max and sum.
__global__ void attention_kernel(Geometry g, const float* q, const float* k, const float* kr, const float* v,
                                 float* part, int64_t n_rows, int64_t split_keys) {
  extern __shared__ float smem[];
  const int64_t DK = g.Dk + g.Dr, ks = DK + 1;  // padded key row: conflict-free column reads
  float* Ks = smem;                              // [kKeys][ks]
  float* Vs = Ks + kKeys * ks;                   // [kKeys][Dv]
  float* Ss = Vs + kKeys * g.Dv;                 // [kRows][kKeys]
  __shared__ float m_run[kRows], l_run[kRows], corr[kRows];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t kvh = blockIdx.y, split = blockIdx.z;
  const int64_t r0 = blockIdx.x * int64_t(kRows);
  const int64_t n_keys = g.P + g.Tq;
  const int64_t key_begin = split * split_keys, key_end = min(n_keys, key_begin + split_keys);
  // The last key any row of this block sees (causal: query i sees keys <= P + i).
  int64_t i_last, h_tmp;
  row_of(g, kvh, min(r0 + kRows, n_rows) - 1, i_last, h_tmp);
  const int64_t block_key_end = min(key_end, g.P + i_last + 1);
  if (tid < kRows) m_run[tid] = -INFINITY, l_run[tid] = 0.f;
  // Output accumulators: thread owns row tid / 16 and columns (tid % 16) + 16 j.
  const int my_row = tid / 16, my_col = tid % 16;
  float acc[kMaxDv / 16];
#pragma unroll
  for (int j = 0; j < kMaxDv / 16; ++j) acc[j] = 0.f;
  for (int64_t kb = key_begin; kb < block_key_end; kb += kKeys) {
    const int nk = int(min(int64_t(kKeys), block_key_end - kb));
    __syncthreads();  // the previous step's Ks / Vs / Ss are consumed
    for (int64_t e = tid; e < int64_t(nk) * DK; e += kThreads) {
      const int64_t j = e / DK, c = e - j * DK, key = kb + j;
      Ks[j * ks + c] = c < g.Dk ? k[key * g.k_tok + kvh * g.k_head + c] : kr[key * g.kr_tok + (c - g.Dk)];
    }
    for (int64_t e = tid; e < int64_t(nk) * g.Dv; e += kThreads) {
      const int64_t j = e / g.Dv, c = e - j * g.Dv, key = kb + j;
      Vs[j * g.Dv + c] = v[key * g.v_tok + kvh * g.v_head + c];
    }
    __syncthreads();
    // Scores: thread takes key tid % 32 for rows tid / 32 and tid / 32 + 8.
    for (int rr = warp; rr < kRows; rr += kThreads / 32) {
      const int64_t r = r0 + rr;
      float s = -INFINITY;
      if (r < n_rows && lane < nk) {
        int64_t i, h;
        row_of(g, kvh, r, i, h);
        const int64_t key = kb + lane;
        if (key <= g.P + i) {
          const float* qr = q + i * g.q_tok + h * g.q_head;
          const float* kj = Ks + lane * ks;
          float dot = 0.f;
          for (int64_t c = 0; c < DK; ++c) dot += qr[c] * kj[c];
          s = dot * g.scale;
        }
      }
      // Online softmax for this row: new max, rescale factor, probabilities.
      const float mx = warp_max(s);
      const float m_old = m_run[rr];
      const float m_new = fmaxf(m_old, mx);
      const float p = m_new == -INFINITY ? 0.f : expf(s - m_new);
      const float psum = warp_sum(p);
      Ss[rr * kKeys + lane] = p;
      __syncwarp();
      if (lane == 0) {
        const float c = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
        corr[rr] = c;
        l_run[rr] = l_run[rr] * c + psum;
        m_run[rr] = m_new;
      }
    }
    __syncthreads();
    // O = O * corr + P V for the thread's row and columns.
    const float c = corr[my_row];
#pragma unroll
    for (int j = 0; j < kMaxDv / 16; ++j) acc[j] *= c;
    for (int key = 0; key < nk; ++key) {
      const float p = Ss[my_row * kKeys + key];
      const float* vr = Vs + key * g.Dv + my_col;
#pragma unroll
      for (int j = 0; j < kMaxDv / 16; ++j)
        if (my_col + 16 * j < g.Dv) acc[j] += p * vr[16 * j];
    }
  }
  __syncthreads();
  const int64_t r = r0 + my_row;
  if (r >= n_rows) return;
  float* out = part + ((split * g.Hkv + kvh) * n_rows + r) * (g.Dv + 2);
#pragma unroll
  for (int j = 0; j < kMaxDv / 16; ++j)
    if (my_col + 16 * j < g.Dv) out[my_col + 16 * j] = acc[j];
  if (my_col == 0) {
    out[g.Dv] = m_run[my_row];
    out[g.Dv + 1] = l_run[my_row];
  }
}

// o[i, h] = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s over the splits; lse = M + log(sum).
__global__ void combine_kernel(Geometry g, const float* part, float* o, float* lse, int64_t n_rows, int64_t splits) {
  const int64_t row = blockIdx.x, kvh = blockIdx.y;
  int64_t i, h;
  row_of(g, kvh, row, i, h);
  float M = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) M = fmaxf(M, part[((s * g.Hkv + kvh) * n_rows + row) * (g.Dv + 2) + g.Dv]);
  float L = 0.f;
  for (int64_t s = 0; s < splits; ++s) {
    const float* p = part + ((s * g.Hkv + kvh) * n_rows + row) * (g.Dv + 2);
    if (p[g.Dv] != -INFINITY) L += expf(p[g.Dv] - M) * p[g.Dv + 1];
  }
  for (int64_t c = threadIdx.x; c < g.Dv; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t s = 0; s < splits; ++s) {
      const float* p = part + ((s * g.Hkv + kvh) * n_rows + row) * (g.Dv + 2);
      if (p[g.Dv] != -INFINITY) acc += expf(p[g.Dv] - M) * p[c];
    }
    o[i * g.o_tok + h * g.o_head + c] = acc / L;
  }
  if (lse && threadIdx.x == 0) lse[i * g.H + h] = M + logf(L);
}

}  // namespace

size_t attention_workspace_bytes(const AttentionDims& dims) {
  const AttentionDims d = dims.resolved();
  const int64_t n_rows = d.Tq * (d.H / d.Hkv), n_keys = d.P + d.Tq;
  const int64_t splits = (n_keys + kSplitKeys - 1) / kSplitKeys;
  return sizeof(float) * size_t(splits * d.Hkv * n_rows * (d.Dv + 2));
}

void launch_attention(cudaStream_t st, float* o, const float* q, const float* k, const float* kr, const float* v,
                      const AttentionDims& dims, float* lse, void* ws) {
  const AttentionDims d = dims.resolved();
  if (d.Tq <= 0) return;
  if (d.Dv > kMaxDv) fail("CUDA attention: value width " + std::to_string(d.Dv) + " (at most 512)");
  Geometry g{d.Tq, d.P, d.H, d.Hkv, d.Dk, d.Dr, d.Dv, d.H / d.Hkv, float(d.scale),
             d.q_tok, d.q_head, d.k_tok, d.k_head, d.kr_tok, d.v_tok, d.v_head, d.o_tok, d.o_head};
  const int64_t n_rows = d.Tq * g.group, n_keys = d.P + d.Tq;
  const int64_t splits = (n_keys + kSplitKeys - 1) / kSplitKeys;
  const size_t smem = sizeof(float) * size_t(kKeys * (d.Dk + d.Dr + 1) + kKeys * d.Dv + kRows * kKeys);
  static size_t raised = 0;
  if (smem > 48 * 1024 && smem > raised) {
    K3_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = smem;
  }
  float* part = static_cast<float*>(ws);
  const dim3 grid(unsigned((n_rows + kRows - 1) / kRows), unsigned(d.Hkv), unsigned(splits));
  attention_kernel<<<grid, kThreads, smem, st>>>(g, q, k, kr, v, part, n_rows, kSplitKeys);
  K3_CUDA_LAUNCHED();
  combine_kernel<<<dim3(unsigned(n_rows), unsigned(d.Hkv)), 128, 0, st>>>(g, part, o, lse, n_rows, splits);
  K3_CUDA_LAUNCHED();
}

}  // namespace k3::cuda
