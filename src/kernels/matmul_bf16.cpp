// Tile products in f32 and bf16 (contract in matmul_bf16.h), compiled once per SIMD target
// (Highway). Register-blocked micro-kernels: MR rows x NV vectors of C live in registers over
// the whole k loop, A elements (f32) or A pairs (bf16) are broadcast, B rows (or VNNI
// pair-rows) are loaded as vectors. The column loop is outside the row loop, so a
// K x (L NV) panel of B stays in L1 while the rows stream past it. bf16 operands are widened
// in registers (a bf16 is the high half of an f32: shift or mask), so the products are exact
// and the sums f32, as vdpbf16ps would; on CPUs with AVX512-BF16 mm_bf16 runs the
// hand-written vdpbf16ps kernel of matmul_bf16_avx512bf16.cpp instead.
#include "kernels/matmul_bf16.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/simd_target.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_bf16.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/simd/vec-inl.h"

// Defined in the first pass of foreach_target (this file is compiled once per target) and
// used by every target's drivers and by the references.
#ifndef K3_MATMUL_TRI_RANGE_
#define K3_MATMUL_TRI_RANGE_
namespace k3 {
namespace {
// k range [k0, k1) that can hold non-zeros of A for rows [i0, i0 + mr) (see Tri).
inline void tri_range(Tri tri, int64_t i0, int64_t mr, int64_t K, int64_t* k0, int64_t* k1) {
  *k0 = 0;
  *k1 = K;
  if (tri == Tri::Lower) *k1 = std::min(K, i0 + mr);
  if (tri == Tri::Upper) *k0 = std::min(K, i0);
}
}  // namespace
}  // namespace k3
#endif

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {
namespace {

using DU32 = hn::RebindToUnsigned<DF>;

HWY_INLINE VF epilogue(DF d, VF acc, const float* c, float alpha, bool accumulate, const float* cs) {
  if (cs) acc = hn::Mul(acc, hn::LoadU(d, cs));
  const VF va = hn::Set(d, alpha);
  return accumulate ? hn::MulAdd(acc, va, hn::LoadU(d, c)) : hn::Mul(acc, va);
}

// f32: 8 x 2 vectors on AVX-512 (16 accumulators), 6 x 2 with 16 registers.
constexpr int kMrF32 = kVecRegs == 32 ? 8 : 6, kNvF32 = 2;

// C[MR, L NV] (+)= A[MR, k0:k1] B[k0:k1, L NV].
template <int MR, int NV, bool AT>
void ukr_f32(int64_t k0, int64_t k1, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
             float alpha, bool accumulate, const float* cs) {
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d));
  VF acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t k = k0; k < k1; ++k) {
    VF b[NV];
    for (int v = 0; v < NV; ++v) b[v] = hn::LoadU(d, B + k * ldb + L * v);
    for (int r = 0; r < MR; ++r) {
      const VF a = hn::Set(d, AT ? A[k * lda + r] : A[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* c = C + r * ldc + L * v;
      hn::StoreU(epilogue(d, acc[r][v], c, alpha, accumulate, cs ? cs + L * v : nullptr), d, c);
    }
}

using UkrF32 = void (*)(int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, float, bool,
                        const float*);
struct TableF32 {
  UkrF32 f[kMrF32][kNvF32];
};
template <bool AT, int... R>
constexpr TableF32 f32_table(std::integer_sequence<int, R...>) {
  TableF32 t{};
  ((t.f[R][0] = &ukr_f32<R + 1, 1, AT>, t.f[R][1] = &ukr_f32<R + 1, 2, AT>), ...);
  return t;
}

// bf16: a VNNI word (k pair) of B is two f32s after a shift (low half) and a mask (high half).
constexpr int kMrBf = kVecRegs == 32 ? 8 : 4, kNvBf = 2;

template <int MR, int NV>
void ukr_bf16(int64_t kk0, int64_t kk1, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, float* C,
              int64_t ldc, float alpha, bool accumulate, const float* cs) {
  const DF d;
  const DU32 du;
  const int64_t L = int64_t(hn::Lanes(d));
  const auto hi_mask = hn::Set(du, 0xffff0000u);
  VF acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t kk = kk0; kk < kk1; ++kk) {
    VF blo[NV], bhi[NV];
    for (int v = 0; v < NV; ++v) {
      const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(Bp + kk * 2 * ldb) + L * v);
      blo[v] = hn::BitCast(d, hn::ShiftLeft<16>(w));
      bhi[v] = hn::BitCast(d, hn::And(w, hi_mask));
    }
    for (int r = 0; r < MR; ++r) {
      const VF alo = hn::Set(d, bf16_to_f32(A[r * lda + 2 * kk]));
      const VF ahi = hn::Set(d, bf16_to_f32(A[r * lda + 2 * kk + 1]));
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(ahi, bhi[v], hn::MulAdd(alo, blo[v], acc[r][v]));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* c = C + r * ldc + L * v;
      hn::StoreU(epilogue(d, acc[r][v], c, alpha, accumulate, cs ? cs + L * v : nullptr), d, c);
    }
}

using UkrBf16 = void (*)(int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, float,
                         bool, const float*);
struct TableBf16 {
  UkrBf16 f[kMrBf][kNvBf];
};
template <int... R>
constexpr TableBf16 bf16_table(std::integer_sequence<int, R...>) {
  TableBf16 t{};
  ((t.f[R][0] = &ukr_bf16<R + 1, 1>, t.f[R][1] = &ukr_bf16<R + 1, 2>), ...);
  return t;
}

// f32 -> bf16 bits, round to nearest even, NaN quieted (core/dtype.h f32_to_bf16), in the
// low 16 bits of each 32-bit lane.
HWY_INLINE hn::Vec<DU32> bf16_bits(DF d, VF x) {
  const DU32 du;
  const auto u = hn::BitCast(du, x);
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)))));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), quiet, rounded);
}

// 8 x 8 (or 4 x 4, 1 x 1: the capped width L8 of the target) transpose of 32-bit lanes held in
// r[0..L8); Highway interleaves work within 128-bit blocks, so the 8-wide form finishes with a
// block concatenation.
using D8 = hn::CappedTag<float, 8>;
using V8 = hn::Vec<D8>;
template <size_t L8>
HWY_INLINE void transpose_block(V8* r) {
#if HWY_TARGET == HWY_SCALAR
  (void)r;  // one lane: nothing to move
#else
  const D8 d;
  if constexpr (L8 == 1) {
    return;
  } else {
    const hn::Repartition<double, D8> d64;
    V8 t[L8];
    for (size_t i = 0; i < L8; i += 2) {
      t[i] = hn::InterleaveLower(d, r[i], r[i + 1]);
      t[i + 1] = hn::InterleaveUpper(d, r[i], r[i + 1]);
    }
    V8 u[L8];
    for (size_t i = 0; i < L8; i += 4)
      for (size_t j = 0; j < 2; ++j) {
        const auto a = hn::BitCast(d64, t[i + j]), b = hn::BitCast(d64, t[i + 2 + j]);
        u[i + 2 * j] = hn::BitCast(d, hn::InterleaveLower(d64, a, b));
        u[i + 2 * j + 1] = hn::BitCast(d, hn::InterleaveUpper(d64, a, b));
      }
    if constexpr (L8 == 4) {
      for (size_t i = 0; i < 4; ++i) r[i] = u[i];
    } else {
      // u[0..3]: columns 0..3 (rows 0-3) in the low block, 4..7 in the high; u[4..7]: rows 4-7.
      for (size_t j = 0; j < 4; ++j) {
        r[j] = hn::ConcatLowerLower(d, u[4 + j], u[j]);
        r[4 + j] = hn::ConcatUpperUpper(d, u[4 + j], u[j]);
      }
    }
  }
#endif
}

}  // namespace

void MmF32(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb, int64_t M,
           int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  static constexpr auto kN = f32_table<false>(std::make_integer_sequence<int, kMrF32>{});
  static constexpr auto kT = f32_table<true>(std::make_integer_sequence<int, kMrF32>{});
  const auto& tab = a_trans ? kT : kN;
  const int64_t L = int64_t(hn::Lanes(DF()));
  for (int64_t n0 = 0; n0 < N; n0 += L * kNvF32) {
    const int64_t nv = std::min<int64_t>(kNvF32, (N - n0) / L);
    const float* cs = colscale ? colscale + n0 : nullptr;
    for (int64_t i0 = 0; i0 < M; i0 += kMrF32) {
      const int64_t mr = std::min<int64_t>(kMrF32, M - i0);
      int64_t k0, k1;
      tri_range(tri, i0, mr, K, &k0, &k1);
      const float* a = a_trans ? A + i0 : A + i0 * lda;
      tab.f[mr - 1][nv - 1](k0, std::max(k0, k1), a, lda, B + n0, ldb, C + i0 * ldc + n0, ldc, alpha, accumulate, cs);
    }
  }
}

void MmBf16(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
            int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  static constexpr auto kTab = bf16_table(std::make_integer_sequence<int, kMrBf>{});
  const int64_t L = int64_t(hn::Lanes(DF()));
  for (int64_t n0 = 0; n0 < N; n0 += L * kNvBf) {
    const int64_t nv = std::min<int64_t>(kNvBf, (N - n0) / L);
    const float* cs = colscale ? colscale + n0 : nullptr;
    for (int64_t i0 = 0; i0 < M; i0 += kMrBf) {
      const int64_t mr = std::min<int64_t>(kMrBf, M - i0);
      int64_t k0, k1;
      tri_range(tri, i0, mr, K, &k0, &k1);
      const int64_t kk0 = k0 / 2, kk1 = std::max(kk0, (k1 + 1) / 2);
      kTab.f[mr - 1][nv - 1](kk0, kk1, A + i0 * lda, lda, Bp + 2 * n0, ldb, C + i0 * ldc + n0, ldc, alpha, accumulate,
                             cs);
    }
  }
}

void ToBf16(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
            const float* colscale) {
  const DF d;
  const hn::Rebind<uint16_t, DF> d16;
  const size_t L = hn::Lanes(d);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * lds;
    uint16_t* o = dst + r * ldd;
    int64_t c = 0;
    for (; c + int64_t(L) <= cols; c += int64_t(L)) {
      VF x = hn::LoadU(d, s + c);
      if (colscale) x = hn::Mul(x, hn::LoadU(d, colscale + c));
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<DF>(), bf16_bits(d, x))), d16, o + c);
    }
    for (; c < cols; ++c) o[c] = f32_to_bf16(colscale ? s[c] * colscale[c] : s[c]);
  }
}

void PackVnni(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N) {
  const DF d;
  const DU32 du;
  const size_t L = hn::Lanes(d);
  for (int64_t kk = 0; kk < (K + 1) / 2; ++kk) {
    const float* lo = src + 2 * kk * lds;
    const float* hi = 2 * kk + 1 < K ? lo + lds : nullptr;
    uint32_t* o = reinterpret_cast<uint32_t*>(dst + kk * 2 * ldd);
    int64_t n = 0;
    for (; n + int64_t(L) <= N; n += int64_t(L)) {
      const auto l = bf16_bits(d, hn::LoadU(d, lo + n));
      const auto h = hi ? bf16_bits(d, hn::LoadU(d, hi + n)) : hn::Zero(du);
      hn::StoreU(hn::Or(l, hn::ShiftLeft<16>(h)), du, o + n);  // word n = (B(2kk, n), B(2kk+1, n))
    }
    for (; n < N; ++n) {
      const uint32_t l = f32_to_bf16(lo[n]), h = hi ? f32_to_bf16(hi[n]) : 0u;
      o[n] = l | (h << 16);
    }
  }
}

void TransposeF32(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                  const float* colscale) {
  const D8 d;
  constexpr size_t L8 = hn::MaxLanes(D8());
  const int64_t B = int64_t(hn::Lanes(d));
  const int64_t R = rows / B * B, Cc = cols / B * B;
  for (int64_t r0 = 0; r0 < R; r0 += B)
    for (int64_t c0 = 0; c0 < Cc; c0 += B) {
      V8 r[L8];
      for (size_t i = 0; i < L8; ++i) r[i] = hn::LoadU(d, src + (r0 + int64_t(i)) * lds + c0);
      transpose_block<L8>(r);
      for (size_t j = 0; j < L8; ++j) {
        V8 x = r[j];
        if (colscale) x = hn::Mul(x, hn::Set(d, colscale[c0 + int64_t(j)]));
        hn::StoreU(x, d, dst + (c0 + int64_t(j)) * ldd + r0);
      }
    }
  // ragged edges
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = (r < R ? Cc : 0); c < cols; ++c)
      dst[c * ldd + r] = colscale ? src[r * lds + c] * colscale[c] : src[r * lds + c];
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3 {

HWY_EXPORT(MmF32);
HWY_EXPORT(MmBf16);
HWY_EXPORT(ToBf16);
HWY_EXPORT(PackVnni);
HWY_EXPORT(TransposeF32);

// The vdpbf16ps kernel (matmul_bf16_avx512bf16.cpp); false (nothing computed) where the
// compiler cannot build it.
bool mm_bf16_avx512bf16(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb,
                        int64_t M, int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale);

void mm_f32_ref(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb,
                int64_t M, int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  for (int64_t i = 0; i < M; ++i) {
    int64_t k0, k1;
    tri_range(tri, i, 1, K, &k0, &k1);
    for (int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (int64_t k = k0; k < k1; ++k) s += (a_trans ? A[k * lda + i] : A[i * lda + k]) * B[k * ldb + n];
      if (colscale) s *= colscale[n];
      C[i * ldc + n] = accumulate ? C[i * ldc + n] + alpha * s : alpha * s;
    }
  }
}

void mm_bf16_ref(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
                 int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  for (int64_t i = 0; i < M; ++i) {
    int64_t k0, k1;
    tri_range(tri, i, 1, K, &k0, &k1);
    for (int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (int64_t k = k0; k < k1; ++k)
        s += bf16_to_f32(A[i * lda + k]) * bf16_to_f32(Bp[(k / 2) * 2 * ldb + 2 * n + (k & 1)]);
      if (colscale) s *= colscale[n];
      C[i * ldc + n] = accumulate ? C[i * ldc + n] + alpha * s : alpha * s;
    }
  }
}

void mm_f32(float* C, int64_t ldc, const float* A, int64_t lda, bool a_trans, const float* B, int64_t ldb, int64_t M,
            int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  K3_ASSERT(N % 16 == 0, "mm_f32: N must be a multiple of 16");
  HWY_DYNAMIC_DISPATCH(MmF32)(C, ldc, A, lda, a_trans, B, ldb, M, N, K, alpha, accumulate, tri, colscale);
}

bool mm_bf16_native() {
  // The CPU has AVX512-BF16 and the kernels may use AVX-512 (not forced to a lower target).
  static const bool cpu = cpu_has_avx512_bf16();
  return cpu && simd_avx512_allowed();
}

void mm_bf16(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb, int64_t M,
             int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  K3_ASSERT(N % 16 == 0 && K % 2 == 0 && lda % 2 == 0, "mm_bf16: N must be a multiple of 16, K and lda even");
  if (mm_bf16_native() && mm_bf16_avx512bf16(C, ldc, A, lda, Bp, ldb, M, N, K, alpha, accumulate, tri, colscale))
    return;
  HWY_DYNAMIC_DISPATCH(MmBf16)(C, ldc, A, lda, Bp, ldb, M, N, K, alpha, accumulate, tri, colscale);
}

void to_bf16(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
             const float* colscale) {
  HWY_DYNAMIC_DISPATCH(ToBf16)(dst, ldd, src, lds, rows, cols, colscale);
}

void pack_vnni(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N) {
  HWY_DYNAMIC_DISPATCH(PackVnni)(dst, ldd, src, lds, K, N);
}

void transpose_f32(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                   const float* colscale) {
  HWY_DYNAMIC_DISPATCH(TransposeF32)(dst, ldd, src, lds, rows, cols, colscale);
}

// The transposed bf16 packs: an f32 transpose into a per-thread buffer, then the row-wise
// conversion (both vectorised on every target).
void to_bf16_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  thread_local std::vector<float> t;
  if (t.size() < size_t(rows * cols)) t.resize(size_t(rows * cols));
  transpose_f32(t.data(), rows, src, lds, rows, cols);
  to_bf16(dst, ldd, t.data(), rows, cols, rows);
}

void pack_vnni_t(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                 const float* kscale) {
  // B(k, n) = src[n*lds + k] kscale[k]: transposing src ([N, K]) scales its columns k.
  thread_local std::vector<float> t;
  if (t.size() < size_t(K * N)) t.resize(size_t(K * N));
  transpose_f32(t.data(), N, src, lds, N, K, kscale);
  pack_vnni(dst, ldd, t.data(), N, K, N);
}

void transpose_f32_ref(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols,
                       const float* colscale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = colscale ? src[r * lds + c] * colscale[c] : src[r * lds + c];
}

void to_bf16_t_ref(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = f32_to_bf16(src[r * lds + c]);
}

void pack_vnni_t_ref(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t K, int64_t N,
                     const float* kscale) {
  for (int64_t kk = 0; kk < (K + 1) / 2; ++kk)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < 2; ++p) {
        const int64_t k = 2 * kk + p;
        const float x = k < K ? (kscale ? src[n * lds + k] * kscale[k] : src[n * lds + k]) : 0.f;
        dst[kk * 2 * ldd + 2 * n + p] = f32_to_bf16(x);
      }
}

}  // namespace k3
#endif  // HWY_ONCE
