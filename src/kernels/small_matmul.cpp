// yt = W xt for few columns (see small_matmul.h), compiled once per SIMD target (Highway).
#include "kernels/small_matmul.h"

#include <algorithm>

#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/small_matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {
namespace {

// Rows [r0, r0 + R) x columns [c0, c0 + L NV) (the last vector `last` wide).
template <int R, int NV>
HWY_INLINE void tile(float* yt, const float* xt, const float* W, int64_t r0, int64_t c0, int64_t in, int64_t ldx,
                     int64_t ldy, size_t last) {
  const DF d;
  const size_t L = hn::Lanes(d);
  VF acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  const float* w = W + r0 * in;
  const float* x = xt + c0;
  for (int64_t k = 0; k < in; ++k, x += ldx) {
    VF xv[NV];
    for (int v = 0; v < NV; ++v) xv[v] = (v == NV - 1 && last < L) ? LoadTail(d, x + L * v, last) : hn::LoadU(d, x + L * v);
    for (int r = 0; r < R; ++r) {
      const VF b = hn::Set(d, w[r * in + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(b, xv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* dst = yt + (r0 + r) * ldy + c0 + int64_t(L) * v;
      if (v == NV - 1 && last < L)
        StoreTail(d, acc[r][v], dst, last);
      else
        hn::StoreU(acc[r][v], d, dst);
    }
}

// All rows for one block of columns; R x NV accumulators plus NV inputs fill the registers.
template <int NV>
void column_block(float* yt, const float* xt, const float* W, int64_t c0, int64_t in, int64_t out, int64_t ldx,
                  int64_t ldy, size_t last) {
  constexpr int R = std::max(1, std::min(8, (kVecRegs - NV - 2) / NV));
  int64_t r = 0;
  for (; r + R <= out; r += R) tile<R, NV>(yt, xt, W, r, c0, in, ldx, ldy, last);
  for (; r < out; ++r) tile<1, NV>(yt, xt, W, r, c0, in, ldx, ldy, last);
}

}  // namespace

void LinearCols(float* yt, const float* xt, const float* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                int64_t ldy) {
  const int64_t L = int64_t(hn::Lanes(DF())), block = 4 * L;
  for (int64_t c0 = 0; c0 < n; c0 += block) {
    const int64_t w = std::min<int64_t>(block, n - c0);
    const int nv = int((w + L - 1) / L);
    const size_t last = size_t(w - (nv - 1) * L);
    switch (nv) {
      case 1: column_block<1>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
      case 2: column_block<2>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
      case 3: column_block<3>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
      default: column_block<4>(yt, xt, W, c0, in, out, ldx, ldy, last); break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3 {

HWY_EXPORT(LinearCols);

void linear_cols(float* yt, const float* xt, const float* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                 int64_t ldy) {
  K3_ASSERT(n >= 0 && in > 0 && out >= 0 && ldx >= n && ldy >= n, "linear_cols: bad dimensions");
  HWY_DYNAMIC_DISPATCH(LinearCols)(yt, xt, W, n, in, out, ldx, ldy);
}

template <typename T>
void linear_cols_reference(T* yt, const T* xt, const T* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                           int64_t ldy) {
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += double(W[r * in + k]) * double(xt[k * ldx + c]);
      yt[r * ldy + c] = T(acc);
    }
}

template void linear_cols_reference<float>(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                           int64_t);
template void linear_cols_reference<double>(double*, const double*, const double*, int64_t, int64_t, int64_t, int64_t,
                                            int64_t);

}  // namespace k3
#endif  // HWY_ONCE
