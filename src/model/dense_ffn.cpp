// Dense SiTU-GLU FFN (see dense_ffn.h).
#include "model/dense_ffn.h"

#include "kernels/activations.h"
#include "kernels/gemm.h"

namespace k3 {

template <typename T>
void dense_ffn_forward(T* out, T* gu, T* act, const T* x, const T* gate, const T* up, const T* down, int64_t Tn,
                       int64_t d, int64_t I, double b1, double b2, bool accumulate) {
  // Both halves land in one [gate | up] row of width 2I, the layout situ_glu_forward reads.
  gemm(false, true, Tn, I, d, T(1), x, d, gate, d, T(0), gu, 2 * I);
  gemm(false, true, Tn, I, d, T(1), x, d, up, d, T(0), gu + I, 2 * I);
  situ_glu_forward(act, gu, Tn, I, b1, b2);
  linear(out, act, down, Tn, I, d, accumulate);
}

template void dense_ffn_forward<float>(float*, float*, float*, const float*, const float*, const float*,
                                       const float*, int64_t, int64_t, int64_t, double, double, bool);
template void dense_ffn_forward<double>(double*, double*, double*, const double*, const double*, const double*,
                                        const double*, int64_t, int64_t, int64_t, double, double, bool);

}  // namespace k3
