// Plain references for the KDA backward (docs/model.md section 3), the first two links of
// the chain of trust for kda_chunk_fast_backward (kda_fast.h):
//   kda_recurrent_backward  reverse mode through the token recurrence of kda.h, token by
//                           token (checked against finite differences in double);
//   kda_chunk_backward      reverse mode through the chunkwise form (kda.h's formulas with
//                           V' = Tm (V - K e^G S)), in-chunk decays formed pairwise
//                           e^(G_i - G_j) <= 1, so any g <= 0 is safe.
// Same layouts as the forward: q, k, g [Tn, H, Dk]; v [Tn, H, Dv]; beta [Tn, H];
// state0 [H, Dk, Dv] (the forward's initial state; null = zeros). do_ [Tn, H, Dv] is the
// gradient of o, dstate_final [H, Dk, Dv] that of the final state (null = zero).
// Outputs (assigned): dq, dk, dg [Tn, H, Dk]; dv [Tn, H, Dv]; dbeta [Tn, H];
// dstate0 [H, Dk, Dv] (may be null). Templates on T, instantiated for float and double.
#pragma once
#include <cstdint>

namespace k3 {

template <typename T>
void kda_recurrent_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* dstate0, const T* do_, const T* dstate_final,
                            const T* q, const T* k, const T* v, const T* g, const T* beta, const T* state0,
                            int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale);

template <typename T>
void kda_chunk_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, T* dstate0, const T* do_, const T* dstate_final,
                        const T* q, const T* k, const T* v, const T* g, const T* beta, const T* state0, int64_t Tn,
                        int64_t H, int64_t Dk, int64_t Dv, double scale, int64_t chunk = 64);

}  // namespace k3
