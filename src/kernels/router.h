// Sigmoid top-k router with a selection-only balancing bias (docs/model.md section 5; fixture
// ops/router.json):
//   s = sigmoid(W_r x)                      scores, [T, E]
//   selected = top_k(s + b)                 the bias b (e_score_correction_bias) only selects
//   w_i = s[selected_i] / sum_j s[selected_j] (if renorm), times `scale`
// The selected experts are listed by descending biased score s + b (the fixture's order);
// ties go to the lower expert index, and a NaN score ranks below every number, so the
// selection is a deterministic total order.
#pragma once
#include "kernels/weight_mat.h"
#include <cstdint>

namespace k3 {

// topk_idx/topk_w [T, k]; scores [T, E] (saved: the unbiased sigmoid scores, also used by
// balancing statistics); x [T, d]; W_r [E, d]; bias [E] (may be null: no bias).
template <typename T>
void router_forward(int32_t* topk_idx, T* topk_w, T* scores, const T* x, const MatT<T>& W_r, const T* bias,
                    int64_t Tn, int64_t d, int64_t E, int64_t k, bool renorm, double scale);

// Backward of router_forward for a fixed selection (training; docs/model.md section 5): the
// gradient flows through the UNBIASED sigmoid scores of the selected experts and the
// renormalisation; the balancing bias only selected, so it gets no gradient at all.
//   w_i = c s_i / Z (renorm: c = scale, Z = sum_sel s + 1e-20; else w_i = scale s_i)
//   ds_m = (scale dw_m - sum_i dw_i w_i) / Z   (renorm)   or  scale dw_m
//   ds  += dscores (optional, every expert: the auxiliary-loss hook, see router_aux_loss)
//   dlogit = ds s (1 - s);  dW_r += dlogit^T x;  dx += dlogit W_r
// dx [T, d] (+=: x also feeds the rest of the MoE block); dW_r [E, d] (+=); dlogits [T, E]
// (assigned: the router-logit gradient, also the work array); dtopk_w [T, k]; dscores
// [T, E] or null; topk_idx [T, k] and scores [T, E] as the forward saved them.
template <typename T>
void router_backward(T* dx, T* dW_r, T* dlogits, const T* dtopk_w, const T* dscores, const int32_t* topk_idx,
                     const T* scores, const T* x, const T* W_r, int64_t Tn, int64_t d, int64_t E, int64_t k,
                     bool renorm, double scale);

// Switch-style auxiliary balance loss (the baseline of docs/model.md section 6) over one
// batch of T tokens; returns its value and assigns its gradient w.r.t. the sigmoid scores
// into dscores [T, E] (may be null), to be passed to router_backward:
//   L   = alpha E sum_j f_j P_j
//   f_j = (number of the T k routed slots that chose j) / (T k)   (counts: not differentiated)
//   P_j = (1/T) sum_t s_tj / Z_t,  Z_t = sum_j' s_tj'   (mean normalised probability; we
//         normalise the sigmoid scores over all E experts so that sum_j P_j = 1)
//   dL/ds_tm = alpha E / (T Z_t) (f_m - sum_j f_j s_tj / Z_t)
// Balanced routing (f_j = P_j = 1/E) gives L = alpha. f and P are per call: a caller that
// splits a batch into micro-batches gets the micro-batch statistics.
template <typename T>
double router_aux_loss(T* dscores, const int32_t* topk_idx, const T* scores, int64_t Tn, int64_t E, int64_t k,
                       double alpha);

// The selection step alone, for one token: the k best experts of s + b (order and ties as
// above). Exposed for quantile-balancing statistics and tests.
template <typename T>
void router_select_topk(int32_t* idx, const T* s, const T* bias, int64_t E, int64_t k);

}  // namespace k3
