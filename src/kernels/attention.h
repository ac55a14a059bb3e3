// Causal softmax attention (the core of the MLA mixer, docs/model.md section 4), one sequence.
// Queries sit at absolute positions [P, P + Tq) and attend to keys [0, P + Tq) (a prefix of P
// cached tokens: decode and chunked prefill); query i sees keys j <= P + i.
//   s_ij = scale * (q_i[:Dk] . k_j[:Dk] + q_i[Dk:] . kr_j),  p = softmax_j(s),  o_i = sum_j p_ij v_j
// The key may have a part `kr` (width Dr) shared by every head (MLA's k_rope), so it need
// not be materialised per head; Dr = 0 means no shared part. Keys/values may have fewer heads
// than queries (Hkv | H; query head h reads kv head h / (H / Hkv)): absorbed MLA decode is
// Hkv = 1 with k = v = the latent cache.
// Layouts are token-major; strides are in elements, 0 picks the packed default
// (q [Tq, H, Dk+Dr], k [P+Tq, Hkv, Dk], kr [P+Tq, Dr], v [P+Tq, Hkv, Dv], o [Tq, H, Dv]).
// Training: the forward may also write lse [Tq, H] (packed), the log-sum-exp of each query's
// scaled scores; the backward (attention_backward.cpp) recomputes the probabilities from it
// tile by tile, so it keeps O(T H) extra memory, not O(T^2 H).
#pragma once
#include <cstdint>
#include <vector>

namespace k3 {

struct AttentionDims {
  int64_t Tq = 0;   // new query tokens
  int64_t P = 0;    // prefix (cached) tokens before them
  int64_t H = 1;    // query heads
  int64_t Hkv = 1;  // key/value heads (H % Hkv == 0)
  int64_t Dk = 0;   // per-kv-head key width
  int64_t Dr = 0;   // shared key width (0: none)
  int64_t Dv = 0;   // value width
  double scale = 1.0;
  // Element strides between consecutive tokens (`*_tok`) and heads (`*_head`); 0 = packed.
  int64_t q_tok = 0, q_head = 0, k_tok = 0, k_head = 0, kr_tok = 0, v_tok = 0, v_head = 0, o_tok = 0, o_head = 0;

  AttentionDims resolved() const;  // zeros replaced by the packed defaults; checks invariants
};

// Plain reference: per head and query a scalar loop, max-subtracted softmax, accumulation in T.
// lse [Tq, H] (optional): log sum_j exp(s_ij), saved for the backward.
template <typename T>
void attention_forward_ref(T* o, const T* q, const T* k, const T* kr, const T* v, const AttentionDims& dims,
                           T* lse = nullptr);

// Reusable per-thread buffers for attention_forward (grow only).
struct AttentionScratch {
  std::vector<float> buf;
};

// Blocked float path: for each kv head and tile of query tokens, the queries of that head
// group are gathered into one matrix, S = Q K^T (+ Q_r Kr^T) and O = softmax(S) V are two
// (three) gemms; tiles run in parallel across OpenMP threads. Equals the reference up to
// float rounding (tests/kernels/test_attention.cpp).
void attention_forward(float* o, const float* q, const float* k, const float* kr, const float* v,
                       const AttentionDims& dims, AttentionScratch& scratch, float* lse = nullptr);

// Backward of the forward above. Each gradient has its input's layout and strides (dq like
// q, dk like k, dkr like kr, dv like v; dout like o) and is ASSIGNED over the whole
// [P + Tq)-key range (prefix keys included). dk and dv may alias (k = v, as in absorbed
// decode): both parts are then summed. dkr may be null only when Dr = 0.
//   dv_j  = sum_i p_ij dout_i
//   ds_ij = p_ij (dout_i . v_j - dout_i . o_i)          (softmax backward; D_i = dout_i . o_i)
//   dq_i  = scale sum_j ds_ij [k_j | kr_j];  dk_j = scale sum_i ds_ij q_i[:Dk];  dkr_j likewise
// Plain reference: recomputes the softmax from q, k, kr (o and lse are ignored, may be null);
// accumulation in T; the oracle of the gradient checks.
template <typename T>
void attention_backward_ref(T* dq, T* dk, T* dkr, T* dv, const T* dout, const T* o, const T* lse, const T* q,
                            const T* k, const T* kr, const T* v, const AttentionDims& dims);

// Blocked float path (FlashAttention-2 style recompute): per kv head (parallel across
// threads), per tile of query tokens, S = Q K^T is recomputed by gemm, P = exp(S - lse)
// from the saved lse (required, as is o), dP = dO V^T, dS = P (dP - D); then dQ = dS K,
// dK += dS^T Q, dV += P^T dO are gemms. Tiles of one head run in order and the shared kr
// gradient is summed over kv heads in head order, so results do not depend on threads.
void attention_backward(float* dq, float* dk, float* dkr, float* dv, const float* dout, const float* o,
                        const float* lse, const float* q, const float* k, const float* kr, const float* v,
                        const AttentionDims& dims, AttentionScratch& scratch);

}  // namespace k3
