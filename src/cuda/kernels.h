// The CUDA backend's kernel launchers (src/cuda/kernels/*.cu), internal to src/cuda: the ops of
// kernels/ops.h (cuda_ops.cu) are made of these. Every pointer is device memory; every launch
// is on `st` and checked (cuda_check.h). Each launcher's contract is the CPU kernel named beside
// it, which is its reference in the op harness (tests/ops) and in tests/cuda.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.h"

namespace k3::cuda {

// ---- elementwise and row-wise (kernels/elementwise.cu) ----
void launch_add(cudaStream_t st, float* y, const float* x, int64_t n);                    // y += x
void launch_sigmoid(cudaStream_t st, float* y, const float* x, int64_t n);                // y = sigmoid(x)
void launch_mul_sigmoid(cudaStream_t st, float* y, const float* a, const float* g, int64_t n);  // y = a sigmoid(g)
void launch_scale(cudaStream_t st, float* x, float f, int64_t n);
void launch_fill(cudaStream_t st, float* x, float v, int64_t n);
void launch_copy_rows(cudaStream_t st, float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows,
                      int64_t cols);
// kernels/norm.h rmsnorm_forward per row with strides; rstd [rows] or null; w [dim] or null.
void launch_rmsnorm(cudaStream_t st, float* y, int64_t ldy, float* rstd, const float* x, int64_t ldx,
                    const float* w, int64_t rows, int64_t dim, float eps);
// kernels/norm.h l2norm_forward: y = x / sqrt(sum x^2 + eps); inv [rows] or null.
void launch_l2norm(cudaStream_t st, float* y, float* inv, const float* x, int64_t rows, int64_t dim, float eps);
// kernels/activations.h situ_glu_forward: act [rows, F] from gu [rows, 2F].
void launch_situ_glu(cudaStream_t st, float* act, const float* gu, int64_t rows, int64_t F, float b1, float b2);
// kernels/kda_gate.h kda_gate_forward.
void launch_kda_gate(cudaStream_t st, float* g, const float* z, const float* A_log, const float* dt_bias, int64_t T,
                     int64_t H, int64_t D, bool bounded, float lower_bound);
// kernels/shortconv.h shortconv_silu_forward (pre may be null; state [C, K-1] in/out).
void launch_shortconv_silu(cudaStream_t st, float* y, float* pre, float* state, const float* x, const float* w,
                           int64_t T, int64_t C, int64_t K);
// kernels/attn_res.h attn_res_forward over S <= kMaxAttnResSources sources (pointers by value).
inline constexpr int kMaxAttnResSources = 32;
void launch_attn_res(cudaStream_t st, float* out, float* alpha, const float* const* sources, int64_t S,
                     const float* w_norm, const float* w_proj, int64_t T, int64_t d, float eps);
// kernels/gemm.h mat_row per token: dst [T, d] = rows ids[t] of W (f32 or bf16: exactly one set).
void launch_embed_rows(cudaStream_t st, float* dst, const float* W_f32, const uint16_t* W_bf16, const int32_t* ids,
                       int64_t T, int64_t d);
// dst [n] bf16 (round to nearest even) = src [n] f32.
void launch_f32_to_bf16(cudaStream_t st, uint16_t* dst, const float* src, int64_t n);

// ---- products (kernels/gemv.cu; the rest through cuBLAS in cuda_ops.cu) ----
// Few-row linear, count products: C_i [M, N] = alpha A_i [M, K] B_i [N, K]^T + beta C_i (rows
// with strides lda / ldb / ldc; A_i = A + i sA, B_i = B + i sB, C_i = C + i sC), B f32 or bf16
// (exactly one set), f32 accumulation; M <= kGemvMaxRows. Each B element is read once.
inline constexpr int64_t kCudaGemvMaxRows = 16;
void launch_gemv_nt(cudaStream_t st, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const float* B_f32, const uint16_t* B_bf16, int64_t ldb, int64_t sB, float beta,
                    float* C, int64_t ldc, int64_t sC, int64_t count);

// ---- router and routed experts (kernels/router.cu, kernels/moe.cu) ----
// kernels/router.h router_forward's selection on sigmoid scores already in `scores` [T, E]:
// idx [T, k] best biased score first (ties: lower index; NaN below every number), w [T, k].
void launch_router_topk(cudaStream_t st, int32_t* idx, float* w, const float* scores, const float* bias, int64_t T,
                        int64_t E, int64_t k, bool renorm, float scale);

// One routed-expert matrix table of a layer on the device (E entries): f32 [rows, cols] or
// MXFP4 packed [rows, cols/2] + scales [rows, cols/32] per expert.
struct ExpertTable {
  const float* const* f32 = nullptr;        // [E] device array of pointers, or null
  const uint8_t* const* packed = nullptr;   // [E] (MXFP4)
  const uint8_t* const* scales = nullptr;   // [E]
};
// Workspace of one routed-experts call (device), sized by moe_workspace_bytes.
size_t moe_workspace_bytes(int64_t T, int64_t n_in, int64_t F, int64_t E, int64_t k);
// kernels/moe.h moe_experts_forward: u [T, n_in] = sum_i w[t, i] W2_e SiTU(W1_e z[t], W3_e z[t]),
// e = idx[t, i], summed in slot order. ws: moe_workspace_bytes of device memory.
void launch_moe_experts(cudaStream_t st, float* u, const float* z, const int32_t* idx, const float* w,
                        const ExpertTable& w1, const ExpertTable& w3, const ExpertTable& w2, int64_t T, int64_t n_in,
                        int64_t F, int64_t E, int64_t k, float b1, float b2, void* ws);

// ---- attention (kernels/attention.cu) ----
// kernels/attention.h attention_forward (strides as resolved() gives them); lse [Tq, H] or null;
// ws: attention_workspace_bytes(dims) of device memory (the key splits' partial results).
size_t attention_workspace_bytes(const AttentionDims& dims);
void launch_attention(cudaStream_t st, float* o, const float* q, const float* k, const float* kr, const float* v,
                      const AttentionDims& dims, float* lse, void* ws);

// ---- KDA (kernels/kda_step.cu, kernels/kda_chunk.cu) ----
// kernels/kda.h kda_recurrent_forward token by token (the decode step), one sequence:
// o [T, H, Dv]; q, k, g [T, H, Dk]; v [T, H, Dv]; beta [T, H]; state [H, Dk, Dv] in/out.
// Dk <= 256, Dv % 32 == 0.
void launch_kda_steps(cudaStream_t st, float* o, float* state, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, int64_t T, int64_t H, int64_t Dk, int64_t Dv, float scale);
// The chunked KDA forward (kernels/kda_fast.h kda_chunk_fast_forward's contract, chunk 64):
// bf16 operands on the tensor cores with f32 accumulation; the cumulative decays, the UT
// forward substitution and the state stay f32. diag_dense: every 16 x 16 sub-tile, diagonal
// ones included, as one dense product anchored at the tile's middle row (safe for g >= -5,
// docs/kda-numerics.md); false: the diagonal sub-tiles pair by pair from products of e^g <= 1
// (any g <= 0: the unbounded gate). state may be null (zero in, not written).
void launch_kda_chunk(cudaStream_t st, float* o, float* state, const float* q, const float* k, const float* v,
                      const float* g, const float* beta, int64_t T, int64_t H, int64_t Dk, int64_t Dv, float scale,
                      bool diag_dense);

// ---- greedy decoding (kernels/argmax.cu) ----
// kernels/ops.h argmax_rows on the device: ids[i], nonfinite[i] for rows[i] of logits (all
// three arrays on the device).
void launch_argmax_rows(cudaStream_t st, int32_t* ids, uint8_t* nonfinite, const float* logits, int64_t ld, int64_t V,
                        const int64_t* rows, int64_t n);

}  // namespace k3::cuda
