// yt = W xt for few columns (see small_matmul.h), compiled once per SIMD target (Highway).
#include "kernels/small_matmul.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/mxfp4_linear.h"

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

// R rows of W (rows [0, R) of Wb) against every column of xt: blocks of NVF vectors, the last
// block narrower. The row block stays in L1 while xt streams from L2 once per row block (the
// column-outer order re-read xt from L2 for every 2-row block on 16-register targets, which
// L2 bandwidth could not feed: 52 GFLOP/s on Zen 2 AVX2).
template <int R>
void row_block(float* yt, const float* xt, const float* Wb, int64_t n, int64_t in, int64_t ldx, int64_t ldy) {
  constexpr int NVF = kVecRegs == 32 ? 4 : 2;
  const int64_t L = int64_t(hn::Lanes(DF())), block = NVF * L;
  for (int64_t c0 = 0; c0 < n; c0 += block) {
    const int64_t w = std::min<int64_t>(block, n - c0);
    const int nv = int((w + L - 1) / L);
    const size_t last = size_t(w - (nv - 1) * L);
    switch (nv) {
      case 1: tile<R, 1>(yt, xt, Wb, 0, c0, in, ldx, ldy, last); break;
      case 2: tile<R, 2>(yt, xt, Wb, 0, c0, in, ldx, ldy, last); break;
      case 3: tile<R, (NVF >= 3 ? 3 : 1)>(yt, xt, Wb, 0, c0, in, ldx, ldy, last); break;
      default: tile<R, (NVF >= 4 ? 4 : 1)>(yt, xt, Wb, 0, c0, in, ldx, ldy, last); break;
    }
  }
}

// Rows of W: f32 in place, or MXFP4 rows dequantised kRows at a time into an L1 buffer (no
// dequantised copy of the whole matrix is written and read back).
constexpr int kRows = 6;  // 6 x 2 (16 registers) or 6 x 4 (32) accumulators

template <typename RowFn>
void all_row_blocks(float* yt, const float* xt, int64_t n, int64_t in, int64_t out, int64_t ldx, int64_t ldy,
                    RowFn&& rows) {
  int64_t r = 0;
  for (; r + kRows <= out; r += kRows) row_block<kRows>(yt + r * ldy, xt, rows(r, kRows), n, in, ldx, ldy);
  for (; r < out; ++r) row_block<1>(yt + r * ldy, xt, rows(r, 1), n, in, ldx, ldy);
}

}  // namespace

void LinearCols(float* yt, const float* xt, const float* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                int64_t ldy) {
  all_row_blocks(yt, xt, n, in, out, ldx, ldy, [&](int64_t r0, int64_t) { return W + r0 * in; });
}

void LinearColsMxfp4(float* yt, const float* xt, const uint8_t* packed, const uint8_t* scales, int64_t n, int64_t in,
                     int64_t out, int64_t ldx, int64_t ldy) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(kRows * in)) buf.resize(size_t(kRows * in));
  all_row_blocks(yt, xt, n, in, out, ldx, ldy, [&](int64_t r0, int64_t rows) {
    mxfp4_dequantize(buf.data(), packed + r0 * (in / 2), scales + r0 * (in / 32), rows, in);
    return static_cast<const float*>(buf.data());
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3 {

HWY_EXPORT(LinearCols);
HWY_EXPORT(LinearColsMxfp4);

void linear_cols(float* yt, const float* xt, const float* W, int64_t n, int64_t in, int64_t out, int64_t ldx,
                 int64_t ldy) {
  K3_ASSERT(n >= 0 && in > 0 && out >= 0 && ldx >= n && ldy >= n, "linear_cols: bad dimensions");
  HWY_DYNAMIC_DISPATCH(LinearCols)(yt, xt, W, n, in, out, ldx, ldy);
}

void linear_cols_mxfp4(float* yt, const float* xt, const uint8_t* packed, const uint8_t* scales, int64_t n, int64_t in,
                       int64_t out, int64_t ldx, int64_t ldy) {
  K3_ASSERT(n >= 0 && in > 0 && in % 32 == 0 && out >= 0 && ldx >= n && ldy >= n, "linear_cols_mxfp4: bad dimensions");
  HWY_DYNAMIC_DISPATCH(LinearColsMxfp4)(yt, xt, packed, scales, n, in, out, ldx, ldy);
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
