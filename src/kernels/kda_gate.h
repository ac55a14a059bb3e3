// KDA log-decay gate (docs/model.md section 3; fixture ops/kda_decay.json). For token t, head h,
// key channel i (c = h*D + i):
//   bounded (K3):           g = lower_bound * sigmoid(exp(A_log[h]) * (z[t, c] + dt_bias[c]))
//   unbounded (Kimi Linear): g = -exp(A_log[h]) * softplus(z[t, c] + dt_bias[c])
// A_log is one value per HEAD, dt_bias one per channel. z = f_b(f_a(x)) is computed by the
// caller (two linears). alpha = exp(g) is the per-channel decay of the recurrence; the
// bounded form keeps g in (lower_bound, 0), i.e. alpha in (e^lower_bound, 1).
#pragma once
#include <cstdint>

namespace k3 {

// g [Tn, H*D] out; z [Tn, H*D]; A_log [H]; dt_bias [H*D].
template <typename T>
void kda_gate_forward(T* g, const T* z, const T* A_log, const T* dt_bias, int64_t Tn, int64_t H, int64_t D,
                      bool bounded, double lower_bound);

// Backward of kda_gate_forward, with u = z + dt_bias and a = exp(A_log[h]):
//   bounded:   dg/du = lower_bound * s (1 - s) * a,  s = sigmoid(a u);  dg/dA_log = dg/du * u
//   unbounded: dg/du = -a * sigmoid(u);                                  dg/dA_log = g
// dz [Tn, H*D] assigned (may alias dg); dA_log [H] and ddt_bias [H*D] accumulated (+=), summed
// over tokens in a fixed order (deterministic); dg, z [Tn, H*D]; A_log [H]; dt_bias [H*D].
template <typename T>
void kda_gate_backward(T* dz, T* dA_log, T* ddt_bias, const T* dg, const T* z, const T* A_log, const T* dt_bias,
                       int64_t Tn, int64_t H, int64_t D, bool bounded, double lower_bound);

}  // namespace k3
