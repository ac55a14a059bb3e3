// RMSNorm and L2 norm, forward and backward (docs/model.md sections 2-4; fixture ops/rmsnorm.json).
// Templates on the scalar type so gradient checks can run in double; rows are independent
// and parallelised across OpenMP threads.
#pragma once
#include <cmath>
#include <cstdint>

namespace k3 {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w   (w may be null: no gain).
// rstd[r] (optional, saved for backward) = 1 / sqrt(mean(x^2) + eps).
template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int64_t rows, int64_t dim, double eps) {
#pragma omp parallel for schedule(static) if (rows * dim > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    T ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const T s = T(1) / std::sqrt(ss / T(dim) + T(eps));
    if (rstd) rstd[r] = s;
    if (w) for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * s * w[i];
    else for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * s;
  }
}

// Backward of rmsnorm_forward. dx is assigned; dw (if non-null) is accumulated (+=).
// y_hat = x * s; dy_hat = dy * w; dx = s * (dy_hat - y_hat * mean(dy_hat * y_hat)).
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const T s = rstd[r];
    T dot = 0;
    for (int64_t i = 0; i < dim; ++i) dot += dyr[i] * (w ? w[i] : T(1)) * xr[i] * s;
    dot /= T(dim);
    for (int64_t i = 0; i < dim; ++i) {
      const T yh = xr[i] * s;
      if (dw) dw[i] += dyr[i] * yh;
      dx[r * dim + i] = s * (dyr[i] * (w ? w[i] : T(1)) - yh * dot);
    }
  }
}

// y = x / sqrt(sum(x^2) + eps) per row (KDA q, k: eps 1e-6, docs/model.md section 3).
// inv[r] (optional) = 1 / sqrt(sum x^2 + eps).
template <typename T>
void l2norm_forward(T* y, T* inv, const T* x, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    T ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += x[r * dim + i] * x[r * dim + i];
    const T s = T(1) / std::sqrt(ss + T(eps));
    if (inv) inv[r] = s;
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * s;
  }
}

// dx = s * (dy - y * (dy . y)); dx assigned.
template <typename T>
void l2norm_backward(T* dx, const T* dy, const T* x, const T* inv, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const T s = inv[r];
    T dot = 0;
    for (int64_t i = 0; i < dim; ++i) dot += dy[r * dim + i] * x[r * dim + i] * s;
    for (int64_t i = 0; i < dim; ++i) dx[r * dim + i] = s * (dy[r * dim + i] - x[r * dim + i] * s * dot);
  }
}

}  // namespace k3
