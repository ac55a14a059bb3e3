// Kimi Delta Attention core (docs/model.md section 3; fixtures ops/kda_recur1.json, kda_recur8.json).
// Per head h, with alpha_t = exp(g_t) (one decay per key channel) and state S [Dk, Dv]:
//   S = diag(alpha_t) S;  u = S^T k_t;  S = S + k_t (beta_t (v_t - u))^T;  o_t = S^T (scale * q_t)
// q and k are used as given (the mixer L2-normalises them first); `scale` multiplies q
// (the mixer passes Dk^-0.5; the fixtures' q_scale). Layouts, one sequence:
//   o, v [Tn, H, Dv]; q, k, g [Tn, H, Dk]; beta [Tn, H]; state [H, Dk, Dv] (in/out: zero for a
//   fresh sequence, the final state on return). Outputs must not alias inputs.
// Three implementations with the same contract:
//   kda_recurrent_forward  plain reference, token by token in the order above (template on T)
//   kda_decode_step        one token, float, two sweeps over each head's state
//   kda_chunk_forward      the chunkwise (UT-transform) form, template on T, k3::gemm products
#pragma once
#include <cstdint>

namespace k3 {

template <typename T>
void kda_recurrent_forward(T* o, T* state, const T* q, const T* k, const T* v, const T* g, const T* beta,
                           int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale);

// Tn = 1 of kda_recurrent_forward: o [H, Dv], q/k/g [H, Dk], beta [H], state [H, Dk, Dv].
// Dv <= kKdaMaxDv.
constexpr int64_t kKdaMaxDv = 1024;
void kda_decode_step(float* o, float* state, const float* q, const float* k, const float* v, const float* g,
                     const float* beta, int64_t H, int64_t Dk, int64_t Dv, double scale);

// Chunkwise form over chunks of `chunk` tokens (the last may be shorter), per head and chunk,
// with gamma = in-chunk cumulative sum of g (rows i, j are tokens of the chunk):
//   A    = StrictLower(diag(beta) (K e^gamma)(K e^-gamma)^T), entries e^(gamma_i - gamma_j) i > j
//   Tm   = (I + A)^-1 diag(beta)                       (forward substitution)
//   W    = Tm (K e^gamma),  U = Tm V,  V' = U - W S
//   O    = (Q e^gamma) S + MaskIncl(Q e^gamma (K e^-gamma)^T) V'   (Q already times scale)
//   S    = diag(e^gamma_last) S + (K e^(gamma_last - gamma))^T V'
// Decay factors are formed as pairwise differences (never e^-gamma alone), so any g <= 0
// (bounded or not) is safe. Equals kda_recurrent_forward up to rounding.
template <typename T>
void kda_chunk_forward(T* o, T* state, const T* q, const T* k, const T* v, const T* g, const T* beta, int64_t Tn,
                       int64_t H, int64_t Dk, int64_t Dv, double scale, int64_t chunk = 64);

}  // namespace k3
