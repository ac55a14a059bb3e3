// Causal softmax attention (the core of the MLA mixer, K3_REFERENCE section 4), one sequence.
// Queries sit at absolute positions [P, P + Tq) and attend to keys [0, P + Tq) (a prefix of P
// cached tokens: decode and chunked prefill); query i sees keys j <= P + i.
//   s_ij = scale * (q_i[:Dk] . k_j[:Dk] + q_i[Dk:] . kr_j),  p = softmax_j(s),  o_i = sum_j p_ij v_j
// The key may have a part `kr` (width Dr) shared by every head (MLA's k_rope), so it need
// not be materialised per head; Dr = 0 means no shared part. Keys/values may have fewer heads
// than queries (Hkv | H; query head h reads kv head h / (H / Hkv)): absorbed MLA decode is
// Hkv = 1 with k = v = the latent cache.
// Layouts are token-major; strides are in elements, 0 picks the packed default
// (q [Tq, H, Dk+Dr], k [P+Tq, Hkv, Dk], kr [P+Tq, Dr], v [P+Tq, Hkv, Dv], o [Tq, H, Dv]).
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
template <typename T>
void attention_forward_ref(T* o, const T* q, const T* k, const T* kr, const T* v, const AttentionDims& dims);

// Reusable per-thread buffers for attention_forward (grow only).
struct AttentionScratch {
  std::vector<float> buf;
};

// Blocked float path: for each kv head and tile of query tokens, the queries of that head
// group are gathered into one matrix, S = Q K^T (+ Q_r Kr^T) and O = softmax(S) V are two
// (three) gemms; tiles run in parallel across OpenMP threads. Equals the reference up to
// float rounding (tests/kernels/test_attention.cpp).
void attention_forward(float* o, const float* q, const float* k, const float* kr, const float* v,
                       const AttentionDims& dims, AttentionScratch& scratch);

}  // namespace k3
