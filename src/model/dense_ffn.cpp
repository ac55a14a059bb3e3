// Dense SiTU-GLU FFN, forward and backward (see dense_ffn.h).
#include "model/dense_ffn.h"

#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/situ_simd.h"

#include <type_traits>

namespace k3 {

template <typename T>
void dense_ffn_forward(const OpsT<T>& ops, T* out, T* gu, T* act, const T* x, const MatT<T>& gate,
                       const MatT<T>& up, const MatT<T>& down, int64_t Tn, int64_t d, int64_t I, double b1, double b2,
                       bool accumulate) {
  // Both halves land in one [gate | up] row of width 2I, the layout situ_glu_forward reads.
  ops.gemm(false, true, Tn, I, d, T(1), x, d, gate, d, T(0), gu, 2 * I);
  ops.gemm(false, true, Tn, I, d, T(1), x, d, up, d, T(0), gu + I, 2 * I);
  // The scalar SiTU (libm tanh/exp): the shared experts' outputs are large in ops/moe.json and
  // its abs 1e-5 tolerance has no room for the vectorised forward's few ulps there.
  ops.situ_glu(act, gu, Tn, I, b1, b2);
  linear(ops, out, act, down, Tn, I, d, accumulate);
}

template <typename T>
void dense_ffn_backward(T* dx, T* dgate, T* dup, T* ddown, T* dgu, T* dact, const T* dout, const T* gu, const T* act,
                        const T* x, const T* gate, const T* up, const T* down, int64_t Tn, int64_t d, int64_t I,
                        double b1, double b2, bool accumulate_dx) {
  dense_ffn_backward_weights<T>(dgate, dup, ddown, dgu, dact, dout, gu, act, x, down, Tn, d, I, b1, b2);
  dense_ffn_backward_input<T>(dx, dgu, gate, up, Tn, d, I, accumulate_dx);
}

template <typename T>
void dense_ffn_backward_weights(T* dgate, T* dup, T* ddown, T* dgu, T* dact, const T* dout, const T* gu, const T* act,
                                const T* x, const T* down, int64_t Tn, int64_t d, int64_t I, double b1, double b2) {
  // out = act down^T: ddown += dout^T act; dact = dout down.
  gemm(true, false, d, I, Tn, T(1), dout, d, act, I, T(1), ddown, I);
  gemm(false, false, Tn, I, d, T(1), dout, d, down, I, T(0), dact, I);
  // act = SiTU(gu[:, :I], gu[:, I:])
  if constexpr (std::is_same_v<T, float>) situ_glu_backward_fast(dgu, dact, gu, Tn, I, b1, b2);
  else situ_glu_backward(dgu, dact, gu, Tn, I, b1, b2);
  // gu = [x gate^T | x up^T]: dgate += dgu_g^T x, dup += dgu_u^T x.
  gemm(true, false, I, d, Tn, T(1), dgu, 2 * I, x, d, T(1), dgate, d);
  gemm(true, false, I, d, Tn, T(1), dgu + I, 2 * I, x, d, T(1), dup, d);
}

template <typename T>
void dense_ffn_backward_input(T* dx, const T* dgu, const T* gate, const T* up, int64_t Tn, int64_t d, int64_t I,
                              bool accumulate_dx) {
  // dx (+)= dgu_g gate + dgu_u up.
  gemm(false, false, Tn, d, I, T(1), dgu, 2 * I, gate, d, accumulate_dx ? T(1) : T(0), dx, d);
  gemm(false, false, Tn, d, I, T(1), dgu + I, 2 * I, up, d, T(1), dx, d);
}

template void dense_ffn_forward<float>(const OpsT<float>&, float*, float*, float*, const float*, const Mat&,
                                       const Mat&, const Mat&, int64_t, int64_t, int64_t, double, double, bool);
template void dense_ffn_forward<double>(const OpsT<double>&, double*, double*, double*, const double*,
                                        const MatT<double>&, const MatT<double>&, const MatT<double>&, int64_t,
                                        int64_t, int64_t, double, double, bool);
template void dense_ffn_backward<float>(float*, float*, float*, float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, const float*, const float*, int64_t,
                                        int64_t, int64_t, double, double, bool);
template void dense_ffn_backward<double>(double*, double*, double*, double*, double*, double*, const double*,
                                         const double*, const double*, const double*, const double*, const double*,
                                         const double*, int64_t, int64_t, int64_t, double, double, bool);

template void dense_ffn_backward_weights<float>(float*, float*, float*, float*, float*, const float*, const float*,
                                                const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                                double, double);
template void dense_ffn_backward_input<float>(float*, const float*, const float*, const float*, int64_t, int64_t,
                                              int64_t, bool);

}  // namespace k3
