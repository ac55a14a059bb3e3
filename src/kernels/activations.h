// Elementwise activations: sigmoid, SiLU, softplus, and SiTU-GLU (docs/model.md section 5;
// fixture ops/situ_glu.json): SiTU(g, u) = [b1 tanh(g/b1) sigmoid(g)] * [b2 tanh(u/b2)],
// the sigmoid sees the uncapped g, so |SiTU| <= b1 * b2 (= 100 for K3).
#pragma once
#include <cmath>
#include <cstdint>

namespace k3 {

template <typename T> inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }
template <typename T> inline T silu(T x) { return x * sigmoid(x); }
template <typename T> inline T softplus(T x) { return x > T(20) ? x : std::log1p(std::exp(x)); }

template <typename T>
inline T situ(T g, T u, T b1, T b2) {
  return b1 * std::tanh(g / b1) * sigmoid(g) * b2 * std::tanh(u / b2);
}
// d situ / dg and d situ / du.
template <typename T>
inline void situ_grad(T g, T u, T b1, T b2, T* dg, T* du) {
  const T th = std::tanh(g / b1), sg = sigmoid(g), tu = std::tanh(u / b2);
  const T cap_g = b1 * th * sg;    // gate half
  const T cap_u = b2 * tu;         // up half
  *dg = ((T(1) - th * th) * sg + b1 * th * sg * (T(1) - sg)) * cap_u;
  *du = cap_g * (T(1) - tu * tu);
}

// out[r, j] = SiTU(gate[r, j], up[r, j]) where gate and up are the two halves of a row of
// `gu` laid out [gate | up] (width 2F); out is [rows, F]. (Fixture layout.)
template <typename T>
void situ_glu_forward(T* out, const T* gu, int64_t rows, int64_t F, double b1, double b2) {
#pragma omp parallel for schedule(static) if (rows * F > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < F; ++j)
      out[r * F + j] = situ(gu[r * 2 * F + j], gu[r * 2 * F + F + j], T(b1), T(b2));
}

// Backward: dgu ([rows, 2F], assigned) from dout ([rows, F]).
template <typename T>
void situ_glu_backward(T* dgu, const T* dout, const T* gu, int64_t rows, int64_t F, double b1, double b2) {
#pragma omp parallel for schedule(static) if (rows * F > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < F; ++j) {
      T dg, du;
      situ_grad(gu[r * 2 * F + j], gu[r * 2 * F + F + j], T(b1), T(b2), &dg, &du);
      dgu[r * 2 * F + j] = dout[r * F + j] * dg;
      dgu[r * 2 * F + F + j] = dout[r * F + j] * du;
    }
}

}  // namespace k3
