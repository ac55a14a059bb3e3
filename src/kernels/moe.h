// Routed SiTU-GLU experts over already-routed rows (the expert part of Stable LatentMoE,
// K3_REFERENCE section 5): for token t with selected experts e_i and weights p_i,
//   u[t] = sum_i p_i * W2_{e_i} SiTU(W1_{e_i} z[t], W3_{e_i} z[t])
// with z [T, n_in] (the latent rows), W1, W3 [F, n_in], W2 [n_in, F] (nn.Linear layout).
// Expert matrices are f32 or MXFP4 (the checkpoint's format, K3_REFERENCE section 8).
//
// Fast path (grouped): assignments are bucketed by expert (counting sort, stable by token);
// per expert with tokens, its rows of z are gathered into one block and go through one gemm
// each for W1, W3 and W2 (an MXFP4 expert is first dequantised into a per-thread buffer);
// experts run in parallel across OpenMP threads. Each expert writes p_i * E(z) into the
// (token, slot) row of a buffer, and u[t] sums its slots in slot order, so the result does
// not depend on the thread count or schedule. Experts without tokens are never touched.
// Reference: per token and slot, plain matrix-vector products accumulated in double.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace k3 {

// One expert matrix [rows, cols]: exactly one of f32 (row-major) or mx is set.
struct ExpertMatrix {
  const float* f32 = nullptr;
  const Mxfp4Matrix* mx = nullptr;
  int64_t rows = 0, cols = 0;
};

// Assignments grouped by expert: expert e owns positions [offset[e], offset[e+1]); each
// position names its token and its flat slot t * k + i. Within an expert, tokens ascend.
struct MoEDispatch {
  std::vector<int64_t> offset;  // [E + 1]
  std::vector<int32_t> token;   // [T * k]
  std::vector<int64_t> slot;    // [T * k]
  std::vector<int64_t> cursor;  // [E] counting-sort work array
};
void moe_dispatch(MoEDispatch& out, const int32_t* topk_idx, int64_t Tn, int64_t k, int64_t E);

// Reusable buffers (grow only; steady-state calls do not allocate).
struct MoEExpertScratch {
  MoEDispatch dispatch;
  std::vector<int32_t> active;  // experts with tokens, ascending
  std::vector<float> slots;     // [T * k, n_in]: p_i * E_i(z[t]) per (token, slot)
  std::vector<float> work;      // per-thread: gathered rows, W1|W3 outputs, SiTU, W2 output, dequantised weights
  std::vector<float> row;       // reference: one decoded MXFP4 row
};

// u [T, n_in] (assigned); z [T, n_in]; topk_idx, topk_w [T, k]; w1, w3, w2: E matrices each.
void moe_experts_forward(float* u, const float* z, const int32_t* topk_idx, const float* topk_w,
                         const ExpertMatrix* w1, const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t Tn,
                         int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                         MoEExpertScratch& scratch);
// Plain reference with the same signature (the test oracle).
void moe_experts_forward_reference(float* u, const float* z, const int32_t* topk_idx, const float* topk_w,
                                   const ExpertMatrix* w1, const ExpertMatrix* w3, const ExpertMatrix* w2,
                                   int64_t Tn, int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                                   MoEExpertScratch& scratch);

}  // namespace k3
