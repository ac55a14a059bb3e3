// Sigmoid top-k router with a selection-only balancing bias (K3_REFERENCE section 5; fixture
// ops/router.json):
//   s = sigmoid(W_r x)                      scores, [T, E]
//   selected = top_k(s + b)                 the bias b (e_score_correction_bias) only selects
//   w_i = s[selected_i] / sum_j s[selected_j] (if renorm), times `scale`
// The selected experts are listed by descending biased score s + b (the fixture's order);
// ties go to the lower expert index, and a NaN score ranks below every number, so the
// selection is a deterministic total order.
#pragma once
#include <cstdint>

namespace k3 {

// topk_idx/topk_w [T, k]; scores [T, E] (saved: the unbiased sigmoid scores, also used by
// balancing statistics); x [T, d]; W_r [E, d]; bias [E] (may be null: no bias).
template <typename T>
void router_forward(int32_t* topk_idx, T* topk_w, T* scores, const T* x, const T* W_r, const T* bias, int64_t Tn,
                    int64_t d, int64_t E, int64_t k, bool renorm, double scale);

// The selection step alone, for one token: the k best experts of s + b (order and ties as
// above). Exposed for quantile-balancing statistics and tests.
template <typename T>
void router_select_topk(int32_t* idx, const T* s, const T* bias, int64_t E, int64_t k);

}  // namespace k3
