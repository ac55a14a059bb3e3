// The ops the model's forward wiring is written against (docs/architecture.md, "Backends").
// src/model composes these and knows nothing of how they compute; each backend implements
// all of them over pointers into its own memory: the CPU backend (cpu_ops(), kernels/
// cpu_ops.cpp: the kernels of this directory, host pointers) and the CUDA backend
// (src/cuda/cuda_ops.h: device pointers, one stream). Every pointer an op takes lives on the
// backend's device() (null: the host), except where a comment says "host".
//
// Argument order follows the kernels: outputs, saved activations, inputs, weights, dims.
// Each op's contract (formula, layouts, which outputs are optional) is its CPU kernel's, named
// beside it; a backend must match that kernel within the op's tolerance in the op harness
// (tests/ops). OpsT<double> exists for the CPU only (the gradient checks' double wiring).
#pragma once
#include <cstdint>
#include <functional>

#include "core/device.h"
#include "kernels/attention.h"
#include "kernels/kda_fast.h"
#include "kernels/moe.h"
#include "kernels/weight_mat.h"

namespace k3 {

// Which KDA core runs (kernels/kda.h, kda_fast.h). The double CPU backend has no fast
// kernels: Fast runs Chunked and StepFast runs Recurrent there.
enum class KDACore {
  Recurrent,  // kda_recurrent_forward: the token-by-token reference
  Chunked,    // kda_chunk_forward: the chunkwise reference (chunk 64)
  Fast,       // kda_chunk_fast_forward with the given options and workspace
  Step,       // kda_decode_step, token by token (float reference decode step)
  StepFast,   // kda_decode_step_fast, token by token
};

// Optional extras of a routed-experts call that only the CPU backend supports: training
// saves, an expert provider (memory-limited inference) and the caller's overlapping work.
struct MoEExpertsExtras {
  float* gu_saved = nullptr;                       // [T * k, 2F]
  float* y_saved = nullptr;                        // [T * k, n_in]
  ExpertProvider* provider = nullptr;
  const std::function<void()>* overlap = nullptr;  // run once (every backend runs it)
};

template <typename R>
class OpsT {
 public:
  virtual ~OpsT() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual Device* device() const = 0;    // null: host memory

  // C [M, N] = alpha op(A) op(B) + beta C, row-major strides (kernels/gemm.h gemm). B as held:
  // f32 or bf16 (weights), or an activation (MatT from a pointer).
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, R alpha, const R* A, int64_t lda,
                    const MatT<R>& B, int64_t ldb, R beta, R* C, int64_t ldc) const = 0;
  // `count` products C_i = alpha op(A_i) op(B_i) + beta C_i with A_i = A + i sA (elements),
  // B_i = B.offset(i sB), C_i = C + i sC (per-head products of absorbed MLA decode).
  virtual void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, R alpha, const R* A,
                            int64_t lda, int64_t sA, const MatT<R>& B, int64_t ldb, int64_t sB, R beta, R* C,
                            int64_t ldc, int64_t sC, int64_t count) const = 0;
  // y [rows, dim] (row stride ldy) = RMSNorm(x) * w, x row stride ldx; rstd [rows] or null
  // (kernels/norm.h rmsnorm_forward, row by row).
  virtual void rmsnorm(R* y, int64_t ldy, R* rstd, const R* x, int64_t ldx, const R* w, int64_t rows, int64_t dim,
                       double eps) const = 0;
  // y = x / sqrt(sum x^2 + eps) per row of dim; inv [rows] (kernels/norm.h l2norm_forward).
  virtual void l2norm(R* y, R* inv, const R* x, int64_t rows, int64_t dim, double eps) const = 0;
  // kernels/shortconv.h shortconv_silu_forward: y, pre (or null) [T, C]; state [C, K-1] in/out.
  virtual void shortconv_silu(R* y, R* pre, R* state, const R* x, const R* w, int64_t T, int64_t C,
                              int64_t K) const = 0;
  // kernels/kda_gate.h kda_gate_forward: g [T, H*D] from z [T, H*D], A_log [H], dt_bias [H*D].
  virtual void kda_gate(R* g, const R* z, const R* A_log, const R* dt_bias, int64_t T, int64_t H, int64_t D,
                        bool bounded, double lower_bound) const = 0;
  // One sequence's KDA core (kernels/kda.h contract): o [T, H, Dv], state [H, Dk, Dv] in/out.
  // opt and ws are the Fast core's (ws: the CPU backend's workspace; others keep their own).
  virtual void kda(KDACore core, R* o, R* state, const R* q, const R* k, const R* v, const R* g, const R* beta,
                   int64_t T, int64_t H, int64_t Dk, int64_t Dv, double scale, const KDAFastOptions& opt,
                   KDAWorkspace& ws) const = 0;
  // Causal attention (kernels/attention.h attention_forward); lse [Tq, H] or null.
  virtual void attention(R* o, const R* q, const R* k, const R* kr, const R* v, const AttentionDims& dims,
                         AttentionScratch& scratch, R* lse) const = 0;
  // Sigmoid top-k router (kernels/router.h router_forward); idx, w [T, k], scores [T, E].
  virtual void router(int32_t* idx, R* w, R* scores, const R* x, const MatT<R>& W_r, const R* bias, int64_t T,
                      int64_t d, int64_t E, int64_t k, bool renorm, double scale) const = 0;
  // Routed SiTU-GLU experts (kernels/moe.h moe_experts_forward; float backends only):
  // u [T, n_in] from z [T, n_in], idx/w [T, k] on the device, w1/w3/w2 E matrices each (a
  // host array of views into device memory).
  virtual void moe_experts(R* u, const R* z, const int32_t* idx, const R* w, const ExpertMatrixT<R>* w1,
                           const ExpertMatrixT<R>* w3, const ExpertMatrixT<R>* w2, int64_t T, int64_t n_in, int64_t F,
                           int64_t E, int64_t k, double b1, double b2, MoEExpertScratch& scratch,
                           const MoEExpertsExtras& extras) const = 0;
  // act [rows, F] = SiTU(gu[:, :F], gu[:, F:]) (kernels/activations.h situ_glu_forward).
  virtual void situ_glu(R* act, const R* gu, int64_t rows, int64_t F, double b1, double b2) const = 0;
  // Attention-Residual read (kernels/attn_res.h attn_res_forward): sources is a HOST array of
  // S pointers (each [T, d] on the device); alpha [T, S] or null.
  virtual void attn_res(R* out, R* alpha, const R* const* sources, int64_t S, const R* w_norm, const R* w_proj,
                        int64_t T, int64_t d, double eps) const = 0;
  // dst [T, d] = rows ids[t] of W [*, d] (kernels/gemm.h mat_row); ids on the device.
  virtual void embed_rows(R* dst, const MatT<R>& W, const int32_t* ids, int64_t T, int64_t d) const = 0;

  // Elementwise (n elements): y += x; y = sigmoid(x); y = a * sigmoid(gate); x *= f; dst = src;
  // dst = v. y may alias x / a.
  virtual void add(R* y, const R* x, int64_t n) const = 0;
  virtual void sigmoid(R* y, const R* x, int64_t n) const = 0;
  virtual void mul_sigmoid(R* y, const R* a, const R* gate, int64_t n) const = 0;
  virtual void scale(R* x, double f, int64_t n) const = 0;
  virtual void copy(R* dst, const R* src, int64_t n) const = 0;
  virtual void fill(R* dst, double v, int64_t n) const = 0;
  // rows x cols block copy with row strides (elements).
  virtual void copy_rows(R* dst, int64_t ld_dst, const R* src, int64_t ld_src, int64_t rows, int64_t cols) const = 0;

  // Greedy decoding on the backend: for each of the n rows rows[i] (HOST array) of logits
  // [*, V] (row stride ld), ids[i] (HOST) = the index of the largest value, the lowest index
  // among equal ones (infer/sampler.h's greedy rule), and nonfinite[i] (HOST) = 1 when the row
  // holds a NaN or an infinity (then ids[i] is unspecified: the caller reads the row itself).
  // A decode step then moves one id per sequence to the host instead of a row of logits.
  virtual void argmax_rows(int32_t* ids, uint8_t* nonfinite, const R* logits, int64_t ld, int64_t V,
                           const int64_t* rows, int64_t n) const = 0;
};
using Ops = OpsT<float>;

// y [rows, out] = x [rows, in] W [out, in]^T (+ y if accumulate): kernels/gemm.h linear on a backend.
template <typename R>
inline void linear(const OpsT<R>& ops, R* y, const R* x, const MatT<R>& W, int64_t rows, int64_t in, int64_t out,
                   bool accumulate = false) {
  ops.gemm(false, true, rows, out, in, R(1), x, in, W, in, accumulate ? R(1) : R(0), y, out);
}

// The CPU backend (host memory; the kernels of this directory, on the dispatched SIMD target).
template <typename R>
const OpsT<R>& cpu_ops();

}  // namespace k3
