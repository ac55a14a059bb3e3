// The MoonViT-V2 encoder's own ops (docs/model.md section 11), forward and backward, templated on
// the scalar type so the gradient checks run in double. Facts from the released Kimi-VL MoonViT
// code (vLLM moonvit.py) and public K3 vision loaders: the position table is resampled like
// F.interpolate(mode="bilinear", align_corners=False); the 2D rotary embedding gives pair
// j = 2i the column angle x f_i and pair j = 2i+1 the row angle y f_i, f_i = theta^(-4i/hd),
// applied to adjacent (re, im) elements of q and k; the merge concatenates each kh x kw block
// of patches row-major. Gradient rule (llm.c): parameter gradients accumulate (+=),
// activation gradients are assigned.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace k3 {

// ---- bilinear resampling of the learned position table ------------------------------------
// Source coordinate of output index i when `in` samples are resized to `out`
// (align_corners=False): s = max(0, (i + 0.5) in / out - 0.5); taps i0 = floor(s),
// i1 = min(i0 + 1, in - 1), weights 1 - l, l with l = s - i0.
struct InterpTap {
  int64_t i0, i1;
  double l;
};
inline InterpTap interp_tap(int64_t i, int64_t in, int64_t out) {
  double s = (double(i) + 0.5) * double(in) / double(out) - 0.5;
  if (s < 0) s = 0;
  int64_t i0 = std::min(int64_t(s), in - 1);
  const int64_t i1 = std::min(i0 + 1, in - 1);
  return {i0, i1, s - double(i0)};
}

// out[y, x, :] (h x w x D, assigned) = bilinear sample of table [ph, pw, D].
template <typename T>
void pos_interp_forward(T* out, const T* table, int64_t ph, int64_t pw, int64_t h, int64_t w, int64_t D) {
  for (int64_t y = 0; y < h; ++y) {
    const InterpTap ty = interp_tap(y, ph, h);
    for (int64_t x = 0; x < w; ++x) {
      const InterpTap tx = interp_tap(x, pw, w);
      const T a = T((1 - ty.l) * (1 - tx.l)), b = T((1 - ty.l) * tx.l), c = T(ty.l * (1 - tx.l)), e = T(ty.l * tx.l);
      const T* r00 = table + (ty.i0 * pw + tx.i0) * D;
      const T* r01 = table + (ty.i0 * pw + tx.i1) * D;
      const T* r10 = table + (ty.i1 * pw + tx.i0) * D;
      const T* r11 = table + (ty.i1 * pw + tx.i1) * D;
      T* o = out + (y * w + x) * D;
      for (int64_t k = 0; k < D; ++k) o[k] = a * r00[k] + b * r01[k] + c * r10[k] + e * r11[k];
    }
  }
}

// dtable += the transpose of the sampling above applied to dout [h, w, D].
template <typename T>
void pos_interp_backward(T* dtable, const T* dout, int64_t ph, int64_t pw, int64_t h, int64_t w, int64_t D) {
  for (int64_t y = 0; y < h; ++y) {
    const InterpTap ty = interp_tap(y, ph, h);
    for (int64_t x = 0; x < w; ++x) {
      const InterpTap tx = interp_tap(x, pw, w);
      const T a = T((1 - ty.l) * (1 - tx.l)), b = T((1 - ty.l) * tx.l), c = T(ty.l * (1 - tx.l)), e = T(ty.l * tx.l);
      const T* g = dout + (y * w + x) * D;
      // forward: o = a r00 + b r01 + c r10 + e r11
      T* r00 = dtable + (ty.i0 * pw + tx.i0) * D;
      T* r01 = dtable + (ty.i0 * pw + tx.i1) * D;
      T* r10 = dtable + (ty.i1 * pw + tx.i0) * D;
      T* r11 = dtable + (ty.i1 * pw + tx.i1) * D;
      for (int64_t k = 0; k < D; ++k) r00[k] += a * g[k];
      for (int64_t k = 0; k < D; ++k) r01[k] += b * g[k];
      for (int64_t k = 0; k < D; ++k) r10[k] += c * g[k];
      for (int64_t k = 0; k < D; ++k) r11[k] += e * g[k];
    }
  }
}

// ---- 2D rotary embedding -------------------------------------------------------------------
// Angles of one token at grid row y, column x: ang[2i] = x f_i, ang[2i+1] = y f_i,
// f_i = theta^(-4i / hd), i < hd / 4; ang has hd / 2 entries (one per (re, im) pair).
template <typename T>
void rope2d_angles(T* ang, int64_t y, int64_t x, int64_t hd, double theta) {
  for (int64_t i = 0; i < hd / 4; ++i) {
    const double f = 1.0 / std::pow(theta, double(4 * i) / double(hd));
    ang[2 * i] = T(double(x) * f);
    ang[2 * i + 1] = T(double(y) * f);
  }
}

// In place on rows [L] of `heads` vectors of width hd at row stride `ld` (q or k inside the
// packed qkv rows): (a, b) -> (a cos - b sin, a sin + b cos) with the token's angles
// cs[t, j] = cos, sn[t, j] = sin (j < hd / 2). sign = -1 rotates back: the backward, since
// the rotation is orthogonal (dx = R^T dy).
template <typename T>
void rope2d_apply(T* x, int64_t ld, const T* cs, const T* sn, int64_t L, int64_t heads, int64_t hd, int sign) {
  for (int64_t t = 0; t < L; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + t * ld + h * hd;
      const T* c = cs + t * (hd / 2);
      const T* s = sn + t * (hd / 2);
      for (int64_t j = 0; j < hd / 2; ++j) {
        const T a = v[2 * j], b = v[2 * j + 1], sj = sign > 0 ? s[j] : -s[j];
        v[2 * j] = a * c[j] - b * sj;
        v[2 * j + 1] = a * sj + b * c[j];
      }
    }
}

// ---- activations ---------------------------------------------------------------------------
// GELU, tanh form (the blocks' MLP, "gelu_pytorch_tanh"): 0.5 x (1 + tanh(c (x + 0.044715 x^3))).
template <typename T>
inline T gelu_tanh(T x) {
  const T c = T(0.7978845608028654);  // sqrt(2 / pi)
  return T(0.5) * x * (T(1) + std::tanh(c * (x + T(0.044715) * x * x * x)));
}
template <typename T>
inline T gelu_tanh_grad(T x) {
  const T c = T(0.7978845608028654);
  const T u = c * (x + T(0.044715) * x * x * x), th = std::tanh(u);
  return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * c * (T(1) + T(3 * 0.044715) * x * x);
}
// GELU, exact (the projector's nn.GELU()): 0.5 x (1 + erf(x / sqrt 2)).
template <typename T>
inline T gelu_erf(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476)));
}
template <typename T>
inline T gelu_erf_grad(T x) {
  return T(0.5) * (T(1) + std::erf(x * T(0.7071067811865476))) + x * T(0.3989422804014327) * std::exp(T(-0.5) * x * x);
}

// ---- 2 x 2 merge ---------------------------------------------------------------------------
// One image's patches x [h w, D] (row-major grid) -> out [(h / kh)(w / kw), kh kw D]: merged
// token (a, b) is the concatenation of patches (a kh + i, b kw + j), (i, j) row-major.
template <typename T>
void patch_merge_forward(T* out, const T* x, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t D) {
  const int64_t nh = h / kh, nw = w / kw;
  for (int64_t a = 0; a < nh; ++a)
    for (int64_t b = 0; b < nw; ++b)
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j)
          std::copy_n(x + ((a * kh + i) * w + b * kw + j) * D, D, out + ((a * nw + b) * kh * kw + i * kw + j) * D);
}
// The inverse permutation (dx assigned).
template <typename T>
void patch_merge_backward(T* dx, const T* dout, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t D) {
  const int64_t nh = h / kh, nw = w / kw;
  for (int64_t a = 0; a < nh; ++a)
    for (int64_t b = 0; b < nw; ++b)
      for (int64_t i = 0; i < kh; ++i)
        for (int64_t j = 0; j < kw; ++j)
          std::copy_n(dout + ((a * nw + b) * kh * kw + i * kw + j) * D, D, dx + ((a * kh + i) * w + b * kw + j) * D);
}

}  // namespace k3
