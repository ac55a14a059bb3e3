// Routed SiTU-GLU experts over already-routed rows (the expert part of Stable LatentMoE,
// docs/model.md section 5): for token t with selected experts e_i and weights p_i,
//   u[t] = sum_i p_i * W2_{e_i} SiTU(W1_{e_i} z[t], W3_{e_i} z[t])
// with z [T, n_in] (the latent rows), W1, W3 [F, n_in], W2 [n_in, F] (nn.Linear layout).
// Expert matrices are f32 or MXFP4 (the checkpoint's format, docs/model.md section 8).
//
// Fast path (grouped): assignments are bucketed by expert (counting sort, stable by token);
// per expert with tokens, its rows of z are gathered into one block and go through one product
// each for W1, W3 and W2, and the vectorised SiTU (kernels/situ_simd.h). f32 experts: BLAS
// gemm. MXFP4 experts: up to 8 rows (decode) through the fused-decode product
// (kernels/mxfp4_linear.h, no dequantised copy); more rows (prefill) dequantise each matrix
// once into a per-thread buffer and run with the rows stored as columns
// (kernels/small_matmul.h). Experts run in parallel across OpenMP threads, each expert on one
// thread (so its result does not depend on the schedule). Each expert writes p_i * E(z) into the
// (token, slot) row of a buffer, and u[t] sums its slots in slot order, so the result does
// not depend on the thread count or schedule. Experts without tokens are never touched.
// Reference: per token and slot, plain matrix-vector products accumulated in double;
// templated on the scalar type R (float, and double for gradient checks).
// Streaming (optional ExpertProvider): the experts' matrices need not be resident. The
// provider hands the active experts out in groups, each valid (pinned) until the next group
// is asked for; every expert runs exactly the same code on the same rows as without a
// provider, writing its own slot rows, so the result is bitwise the resident one.
// Training: both forwards can save, per (token, slot) row t * k + i, the expert's
// [W1 z | W3 z] and its unweighted output W2 SiTU(...); the backwards (moe_backward.cpp)
// take them. Only f32 experts train; MXFP4 experts are inference-only.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace k3 {

// One expert matrix [rows, cols]: exactly one of f32 (row-major, of the scalar type R: the
// name is the float engine's) or mx is set.
template <typename R>
struct ExpertMatrixT {
  const R* f32 = nullptr;
  const Mxfp4Matrix* mx = nullptr;
  int64_t rows = 0, cols = 0;
};
using ExpertMatrix = ExpertMatrixT<float>;

// One expert's parameter gradients (accumulated, +=), shaped like its f32 matrices.
template <typename R>
struct ExpertGradT {
  R* w1 = nullptr;  // [F, n_in]
  R* w3 = nullptr;  // [F, n_in]
  R* w2 = nullptr;  // [n_in, F]
};
using ExpertGrad = ExpertGradT<float>;

// Assignments grouped by expert: expert e owns positions [offset[e], offset[e+1]); each
// position names its token and its flat slot t * k + i. Within an expert, tokens ascend.
struct MoEDispatch {
  std::vector<int64_t> offset;  // [E + 1]
  std::vector<int32_t> token;   // [T * k]
  std::vector<int64_t> slot;    // [T * k]
  std::vector<int64_t> cursor;  // [E] counting-sort work array
};
void moe_dispatch(MoEDispatch& out, const int32_t* topk_idx, int64_t Tn, int64_t k, int64_t E);

// The experts of one group handed out by an ExpertProvider: experts[i] (distinct) with its
// matrices w1[i], w3[i], w2[i], valid until the provider's next() or finish().
struct ExpertGroup {
  const int32_t* experts = nullptr;
  const ExpertMatrix* w1 = nullptr;
  const ExpertMatrix* w3 = nullptr;
  const ExpertMatrix* w2 = nullptr;
  int64_t n = 0;  // 0: every expert of the call has been handed out
};

// Supplies routed expert matrices that are not resident (memory-limited inference: an expert
// cache filled from disk, infer/weight_stream.h). One call of moe_experts_forward on MoE
// layer `layer` is: prefetch(layer, experts) with the call's distinct experts (ascending;
// latent_moe_forward calls it right after routing, so reads overlap the down projection and
// the shared experts), then next() until it returns n == 0 (each returned group is pinned
// until the following next()), then finish() (releases the last group). A provider serves one
// such call at a time; errors (a failed read) are thrown from next() as k3::Error, and the
// next prefetch() starts clean.
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  virtual void prefetch(int64_t layer, const int32_t* experts, int64_t n) = 0;
  virtual ExpertGroup next() = 0;
  virtual void finish() = 0;
};

// Reusable buffers (grow only; steady-state calls do not allocate).
struct MoEExpertScratch {
  MoEDispatch dispatch;
  std::vector<int32_t> active;  // experts with tokens, ascending
  std::vector<float> slots;     // [T * k, n_in]: p_i * E_i(z[t]) per (token, slot)
  std::vector<float> work;      // per-thread: gathered rows, W1|W3 outputs, SiTU, W2 output, dequantised weights
  std::vector<float> row;       // reference: one decoded MXFP4 row
  std::vector<float> ep_in, ep_out;  // expert parallelism: rows in dispatch order, out and back
};

// u [T, n_in] (assigned); z [T, n_in]; topk_idx, topk_w [T, k]; w1, w3, w2: E matrices each.
// Training (optional): gu_saved [T * k, 2F] and y_saved [T * k, n_in] receive, per (token,
// slot), [W1 z | W3 z] and W2 SiTU(W1 z, W3 z) (before the weight p).
// provider (optional): the experts' matrices come from it in groups (w1, w3, w2 are then only
// read for their shapes; prefetch() must already have been called with this call's distinct
// experts, see ExpertProvider).
// overlap (optional): independent work of the caller (the shared experts), run once: first,
// or, in expert-parallel training (moe_exchange.h), while the experts' outputs travel back.
void moe_experts_forward(float* u, const float* z, const int32_t* topk_idx, const float* topk_w,
                         const ExpertMatrix* w1, const ExpertMatrix* w3, const ExpertMatrix* w2, int64_t Tn,
                         int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                         MoEExpertScratch& scratch, float* gu_saved = nullptr, float* y_saved = nullptr,
                         ExpertProvider* provider = nullptr, const std::function<void()>* overlap = nullptr);
// One expert on n gathered rows zg [n, n_in], the grouped path's per-expert step (expert
// parallelism runs it on the owner): gu [n, 2F] = [zg W1^T | zg W3^T], act [n, F] =
// SiTU(gate, up), y [n, n_in] = act W2^T.
void moe_expert_rows_forward(float* gu, float* act, float* y, const float* zg, const ExpertMatrix& w1,
                             const ExpertMatrix& w3, const ExpertMatrix& w2, int64_t n, int64_t n_in, int64_t F,
                             double b1, double b2);
// Its backward (f32 experts): dY [n, n_in] (= p du), zg and gu from the forward; g +=
// the parameter gradients; dZ [n, n_in] assigned; work: 4 n F floats.
void moe_expert_rows_backward(float* dZ, const ExpertGrad& g, const float* dY, const float* zg, const float* gu,
                              const ExpertMatrix& w1, const ExpertMatrix& w3, const ExpertMatrix& w2, int64_t n,
                              int64_t n_in, int64_t F, double b1, double b2, float* work);
// The distinct experts of topk_idx [T * k], ascending, into out (what a provider prefetches).
void moe_distinct_experts(std::vector<int32_t>& out, const int32_t* topk_idx, int64_t Tn, int64_t k, int64_t E);
// Plain reference with the same signature (the test oracle).
template <typename R>
void moe_experts_forward_reference(R* u, const R* z, const int32_t* topk_idx, const R* topk_w,
                                   const ExpertMatrixT<R>* w1, const ExpertMatrixT<R>* w3, const ExpertMatrixT<R>* w2,
                                   int64_t Tn, int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                                   MoEExpertScratch& scratch, R* gu_saved = nullptr, R* y_saved = nullptr);

// Backward for a fixed routing. dz [T, n_in] and dtopk_w [T, k] are assigned; grads: E
// entries, accumulated (+=), touched only for experts with tokens (those need f32 weights
// and all three gradient pointers); du [T, n_in] is the gradient of u.
//   y_i = W2 SiTU(W1 z, W3 z), u = sum_i p_i y_i:  dp_i = du . y_i;  dy_i = p_i du
// Grouped path: per expert with tokens (parallel across experts), its rows are gathered and
// dW2 += dY^T act, dact = dY W2, dW1 += dG^T Z, dW3 += dU^T Z, dZ = dG W1 + dU W3 are gemms
// (act recomputed from the saved gu, y from y_saved); dz sums each token's slots in slot
// order, so the result does not depend on threads.
void moe_experts_backward(float* dz, float* dtopk_w, const ExpertGrad* grads, const float* du,
                          const float* gu_saved, const float* y_saved, const float* z, const int32_t* topk_idx,
                          const float* topk_w, const ExpertMatrix* w1, const ExpertMatrix* w3, const ExpertMatrix* w2,
                          int64_t Tn, int64_t n_in, int64_t F, int64_t E, int64_t k, double b1, double b2,
                          MoEExpertScratch& scratch, const std::function<void()>* overlap = nullptr);
// (overlap, optional: the caller's independent work, run once: first, or in expert-parallel
// training while the output-gradient rows travel to the owners.)
// Plain reference with the same signature: per token and slot, recomputes the expert from z
// and the weights with matrix-vector loops (gu_saved and y_saved are ignored, may be null).
template <typename R>
void moe_experts_backward_reference(R* dz, R* dtopk_w, const ExpertGradT<R>* grads, const R* du, const R* gu_saved,
                                    const R* y_saved, const R* z, const int32_t* topk_idx, const R* topk_w,
                                    const ExpertMatrixT<R>* w1, const ExpertMatrixT<R>* w3,
                                    const ExpertMatrixT<R>* w2, int64_t Tn, int64_t n_in, int64_t F, int64_t E,
                                    int64_t k, double b1, double b2, MoEExpertScratch& scratch);

}  // namespace k3
