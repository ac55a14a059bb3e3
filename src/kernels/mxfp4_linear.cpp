// Products with MXFP4 weight matrices: fused-decode linear and dequantisation, compiled once
// per SIMD target (Highway), and plain references (see mxfp4_linear.h).
#include "kernels/mxfp4_linear.h"

#include <algorithm>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/mxfp4_linear.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/simd/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3 {
namespace HWY_NAMESPACE {
namespace {

using DU8 = hn::Rebind<uint8_t, DI>;  // L bytes, widened to L int32 lanes

// The end of every rows_block: y[t, r0 + r] = the horizontal sum of acc[r][t], added to y's
// value when accumulating.
template <int RB, int NT>
HWY_INLINE void store_rows(float* y, int64_t ldy, int64_t r0, const VF (&acc)[RB][NT], bool accumulate) {
  const DF d;
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t) {
      const float v = HSum(d, acc[r][t]);
      float& dst = y[t * ldy + r0 + r];
      dst = accumulate ? dst + v : v;
    }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The signed table times the scale; the code indexes it directly.
struct Lut {
  VF v;
  Lut() = default;
  explicit Lut(DF d, float scale) : v(hn::Mul(hn::LoadU(d, kE2M1), hn::Set(d, scale))) {}
  HWY_INLINE VF decode(DF d, hn::Vec<DI> c) const {
    return hn::TableLookupLanes(v, hn::IndicesFromVec(d, hn::And(c, hn::Set(DI(), 15))));
  }
};
#elif HWY_TARGET == HWY_AVX2
// The 8 magnitudes times the scale; the code's bit 3 is the sign. A NaN scale (E8M0 255) makes
// every value that NaN, as value * scale does, so its sign is not flipped.
struct Lut {
  VF v;
  bool nan = false;
  Lut() = default;
  explicit Lut(DF d, float scale) : v(hn::Mul(hn::LoadU(d, kE2M1), hn::Set(d, scale))), nan(scale != scale) {}
  HWY_INLINE VF decode(DF d, hn::Vec<DI> c) const {
    const DI di;
    const VF mag = hn::TableLookupLanes(v, hn::IndicesFromVec(d, hn::And(c, hn::Set(di, 7))));
    if (HWY_UNLIKELY(nan)) return mag;
    return hn::Xor(mag, hn::BitCast(d, hn::ShiftLeft<28>(hn::And(c, hn::Set(di, 8)))));
  }
};
#else
// Too few lanes for a table: E2M1 magnitude m = 0bEEM is 2^(E-1) (1 + M/2) for E > 0, which is
// the float with exponent field E + 126 and mantissa top bit M, and M/2 for E = 0.
struct Lut {
  VF s;
  Lut() = default;
  explicit Lut(DF d, float scale) : s(hn::Set(d, scale)) {}
  HWY_INLINE VF decode(DF d, hn::Vec<DI> c) const {
    const DI di;
    const auto m = hn::And(c, hn::Set(di, 7));
    const VF normal = hn::BitCast(d, hn::Add(hn::ShiftLeft<22>(m), hn::Set(di, 126 << 23)));
    const VF sub = hn::Mul(hn::ConvertTo(d, m), hn::Set(d, 0.5f));
    const VF mag = hn::IfThenElse(hn::RebindMask(d, hn::Lt(m, hn::Set(di, 2))), sub, normal);
    const VF sign = hn::BitCast(d, hn::ShiftLeft<28>(hn::And(c, hn::Set(di, 8))));
    return hn::Mul(hn::Xor(mag, sign), s);
  }
};
#endif

// L packed bytes: the L even (low nibble) and L odd (high nibble) weights.
HWY_INLINE void decode_chunk(DF d, const uint8_t* p, const Lut& lut, VF* even, VF* odd) {
  const DI di;
  const auto b = hn::PromoteTo(di, hn::LoadU(DU8(), p));
  *even = lut.decode(d, b);
  *odd = lut.decode(d, hn::ShiftRight<4>(b));
}

constexpr int64_t kPrefetchRows = 16;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Fused product, AVX-512. Per group of 32 weights: the 16 packed bytes are split into low
// and high nibbles and looked up in a 16-byte table of 2x the E2M1 values (exact int8: 0, 1,
// 2, 3, 4, 6, 8, 12 and their negatives; one byte shuffle per 16 weights), widened int8 ->
// int32 -> f32 in L-lane pieces and multiplied into per-group sums; each group's sum is then
// scaled once by 2^(s-127) / 2. Fewer instructions per weight than looking up floats (one
// permute plus sign handling per L weights), which matters: MXFP4 decode is compute-bound
// (measured on Zen 2, AVX2: 4.7 G weights/s per core with the float table, one thread).
alignas(16) constexpr int8_t kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// q [32]: the group's 16 even weights (low nibbles) then its 16 odd ones, as 2x E2M1.
HWY_INLINE void decode_group_i8(const uint8_t* HWY_RESTRICT p, int8_t* HWY_RESTRICT q) {
  const hn::Full128<uint8_t> du8;
  const hn::Full128<int8_t> di8;
  const auto b = hn::LoadU(du8, p);
  const auto nib = hn::Set(du8, 0x0F);
  const auto lut = hn::LoadU(di8, kE2M1x2);
  hn::StoreU(hn::TableLookupBytes(lut, hn::BitCast(di8, hn::And(b, nib))), di8, q);
  hn::StoreU(hn::TableLookupBytes(lut, hn::BitCast(di8, hn::And(hn::ShiftRight<4>(b), nib))), di8, q + 16);
}

using DQ = hn::Rebind<int8_t, DI>;  // L int8 lanes, widened to L int32

// RB weight rows [r0, r0 + RB) against NT split rows of x (per group: 16 even elements, then
// 16 odd). SPLIT: separate even / odd group sums (two short FMA chains instead of one long).
template <int RB, int NT, bool SPLIT>
HWY_INLINE void rows_block(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales,
                           int64_t r0, int64_t in, bool accumulate) {
  const DF d;
  const DI di;
  const int64_t L = int64_t(hn::Lanes(d)), G = in / 32, row_bytes = in / 2;
  VF acc[RB][NT];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = hn::Zero(d);
  HWY_ALIGN int8_t q[RB][32];
  const uint8_t* ahead = packed + (r0 + kPrefetchRows) * row_bytes;
  for (int64_t g = 0; g < G; ++g) {
    if (g % 4 == 0)  // one 64-byte line per row every 4 groups
      for (int r = 0; r < RB; ++r) hwy::Prefetch(ahead + r * row_bytes + g * 16);
    for (int r = 0; r < RB; ++r) decode_group_i8(packed + (r0 + r) * row_bytes + g * 16, q[r]);
    VF ge[RB][NT], go[RB][NT];
    for (int r = 0; r < RB; ++r)
      for (int t = 0; t < NT; ++t) ge[r][t] = go[r][t] = hn::Zero(d);
    for (int64_t c = 0; c < 16; c += L) {
      VF xe[NT], xo[NT];
      for (int t = 0; t < NT; ++t) {
        xe[t] = hn::LoadU(d, xs + t * in + g * 32 + c);
        xo[t] = hn::LoadU(d, xs + t * in + g * 32 + 16 + c);
      }
      for (int r = 0; r < RB; ++r) {
        const VF we = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(DQ(), q[r] + c)));
        const VF wo = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(DQ(), q[r] + 16 + c)));
        for (int t = 0; t < NT; ++t) {
          ge[r][t] = hn::MulAdd(we, xe[t], ge[r][t]);
          if (SPLIT)
            go[r][t] = hn::MulAdd(wo, xo[t], go[r][t]);
          else
            ge[r][t] = hn::MulAdd(wo, xo[t], ge[r][t]);
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      const VF sc = hn::Set(d, 0.5f * e8m0_to_f32(scales[(r0 + r) * G + g]));
      for (int t = 0; t < NT; ++t) acc[r][t] = hn::MulAdd(SPLIT ? hn::Add(ge[r][t], go[r][t]) : ge[r][t], sc, acc[r][t]);
    }
  }
  store_rows<RB, NT>(y, ldy, r0, acc, accumulate);
}

template <int NT>
void all_rows(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales, int64_t in,
              int64_t out, bool accumulate) {
  // Accumulators, group sums and x pieces within the register file (RB x NT x (2 or 3) + 2 NT).
  constexpr int RB = kVecRegs == 32 ? (NT <= 2 ? 4 : NT == 3 ? 3 : 2) : (NT == 1 ? 4 : NT == 2 ? 2 : 1);
  constexpr bool kSplit = NT == 1;
  int64_t r = 0;
  for (; r + RB <= out; r += RB) rows_block<RB, NT, kSplit>(y, ldy, xs, packed, scales, r, in, accumulate);
  for (; r < out; ++r) rows_block<1, NT, kSplit>(y, ldy, xs, packed, scales, r, in, accumulate);
}

// x rows [nt, in] -> xs [nt, in]: per 32-group the 16 even then the 16 odd elements.
void split_even_odd(float* xs, const float* x, int64_t nt, int64_t in, int64_t /*L*/) {
  for (int64_t i = 0; i < nt * in; i += 32)
    for (int64_t j = 0; j < 16; ++j) {
      xs[i + j] = x[i + 2 * j];
      xs[i + 16 + j] = x[i + 2 * j + 1];
    }
}

#elif HWY_TARGET != HWY_SCALAR
// Fused product, 128- and 256-bit targets (SSE4, AVX2, NEON). An E2M1 value is an f32 whose
// low two bytes are 0 (0.5 = 0x3F000000 ... 6 = 0x40C00000, code 8 = -0), so two byte
// shuffles of the codes (tables of the f32's bytes 3 and 2) and one byte interleave give two
// weights per 32-bit word; a shift by 16 and a mask make them f32 lanes, with no int -> float
// or half -> float conversion (the earlier F16C decode: 8.1-8.8 G weights/s on one Zen 2 core,
// this one 11.6-12.0 in the same runs, bench_kernels kernel/mxfp4_linear/rows:1, noisy). The
// lanes come out permuted; x is permuted to match once per call (split_even_odd). The group's
// sum is scaled by 2^(s-127), the scales converted L at a time.
alignas(16) constexpr uint8_t kE2M1Byte3[16] = {0x00, 0x3F, 0x3F, 0x3F, 0x40, 0x40, 0x40, 0x40,
                                                0x80, 0xBF, 0xBF, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0};
alignas(16) constexpr uint8_t kE2M1Byte2[16] = {0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0,
                                                0x00, 0x00, 0x80, 0xC0, 0x00, 0x40, 0x80, 0xC0};
alignas(32) constexpr uint32_t kBlockShift[8] = {0, 0, 0, 0, 4, 4, 4, 4};

using DB = hn::Repartition<uint8_t, DF>;  // the vector as bytes
using DW = hn::Repartition<uint16_t, DF>;
using DU = hn::RebindToUnsigned<DF>;
constexpr int64_t kBlocks = int64_t(hn::MaxLanes(DB())) / 16;  // 128-bit blocks: 1, or 2 on AVX2
constexpr int64_t kLanes = int64_t(hn::MaxLanes(DF()));
constexpr int kGroupVecs = int(32 / kLanes);  // f32 vectors per 32-weight group
static_assert(kBlocks == 1 || kBlocks == 2, "byte-table decode: 128- or 256-bit vectors");

struct GroupDecoder {
  hn::Vec<DB> b3, b2, nib;
  hn::Vec<DU> hi, shift;
  GroupDecoder()
      : b3(hn::LoadDup128(DB(), kE2M1Byte3)),
        b2(hn::LoadDup128(DB(), kE2M1Byte2)),
        nib(hn::Set(DB(), 0x0F)),
        hi(hn::Set(DU(), 0xFFFF0000u)),
        shift(hn::LoadU(DU(), kBlockShift)) {}
  // 16-byte blocks of codes (0..15) -> 4 f32 vectors: per block, lane i of vector 2h + s holds
  // the code of byte 8h + 2i + s.
  HWY_INLINE void expand(hn::Vec<DB> idx, VF* f) const {
    const DB db;
    const DU du;
    const auto a = hn::TableLookupBytes(b3, idx), b = hn::TableLookupBytes(b2, idx);
    const auto lo = hn::BitCast(du, hn::InterleaveLower(db, b, a)), up = hn::BitCast(du, hn::InterleaveUpper(db, b, a));
    f[0] = hn::BitCast(DF(), hn::ShiftLeft<16>(lo));
    f[1] = hn::BitCast(DF(), hn::And(lo, hi));
    f[2] = hn::BitCast(DF(), hn::ShiftLeft<16>(up));
    f[3] = hn::BitCast(DF(), hn::And(up, hi));
  }
  // The 32 weights of the group at p (16 bytes), unscaled, in split_x's order: block q of
  // the codes holds the low (q = 0) or high (q = 1) nibbles.
  HWY_INLINE void decode(const uint8_t* HWY_RESTRICT p, VF* f) const {
    const DB db;
    if constexpr (kBlocks == 2) {
      const auto b = hn::BitCast(DU(), hn::LoadDup128(db, p));
      expand(hn::And(hn::BitCast(db, b >> shift), nib), f);
    } else {
      const auto b = hn::LoadU(db, p);
      expand(hn::And(b, nib), f);
      expand(hn::And(hn::BitCast(db, hn::ShiftRight<4>(hn::BitCast(DW(), b))), nib), f + 4);
    }
  }
};

// sc [n] = 2^(s-127) of the scales s [n] (e8m0_to_f32: 0 is 2^-127, 255 NaN), L at a time.
HWY_INLINE void scales_to_f32(float* HWY_RESTRICT sc, const uint8_t* HWY_RESTRICT s, int64_t n) {
  if (n == kLanes) {
    const DU du;
    const auto u = hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint8_t, DU>(), s));
    auto bits = hn::IfThenElse(hn::Eq(u, hn::Zero(du)), hn::Set(du, 0x00400000u), hn::ShiftLeft<23>(u));
    bits = hn::IfThenElse(hn::Eq(u, hn::Set(du, 255u)), hn::Set(du, 0x7FC00000u), bits);
    hn::Store(hn::BitCast(DF(), bits), DF(), sc);
    return;
  }
  for (int64_t i = 0; i < n; ++i) sc[i] = e8m0_to_f32(s[i]);
}

// RB weight rows [r0, r0 + RB) against NT permuted rows of x; each row's group is decoded
// once for all NT rows, and the sum order of an output does not depend on NT.
template <int RB, int NT>
HWY_INLINE void rows_block(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales,
                           int64_t r0, int64_t in, bool accumulate) {
  const DF d;
  const int64_t G = in / 32, row_bytes = in / 2;
  const GroupDecoder dec;
  VF acc[RB][NT];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = hn::Zero(d);
  HWY_ALIGN float sc[RB][kLanes];
  const uint8_t* ahead = packed + (r0 + kPrefetchRows) * row_bytes;
  for (int64_t g0 = 0; g0 < G; g0 += kLanes) {
    const int64_t ng = std::min(kLanes, G - g0);
    for (int r = 0; r < RB; ++r) scales_to_f32(sc[r], scales + (r0 + r) * G + g0, ng);
    for (int64_t gi = 0; gi < ng; ++gi) {
      const int64_t g = g0 + gi;
      if (g % 4 == 0)  // one 64-byte line per row every 4 groups
        for (int r = 0; r < RB; ++r) hwy::Prefetch(ahead + r * row_bytes + g * 16);
      for (int r = 0; r < RB; ++r) {
        VF f[kGroupVecs];
        dec.decode(packed + (r0 + r) * row_bytes + g * 16, f);
        for (int t = 0; t < NT; ++t) {
          const float* xg = xs + t * in + g * 32;
          VF s0 = hn::Mul(f[0], hn::LoadU(d, xg)), s1 = hn::Mul(f[1], hn::LoadU(d, xg + kLanes));
          for (int v = 2; v < kGroupVecs; v += 2) {
            s0 = hn::MulAdd(f[v], hn::LoadU(d, xg + v * kLanes), s0);
            s1 = hn::MulAdd(f[v + 1], hn::LoadU(d, xg + (v + 1) * kLanes), s1);
          }
          acc[r][t] = hn::MulAdd(hn::Add(s0, s1), hn::Set(d, sc[r][gi]), acc[r][t]);
        }
      }
    }
  }
  store_rows<RB, NT>(y, ldy, r0, acc, accumulate);
}

template <int NT>
void all_rows(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales, int64_t in,
              int64_t out, bool accumulate) {
  // Accumulators, the decoded group and the tables within 16 registers.
  constexpr int RB = NT == 1 ? 4 : NT == 2 ? 2 : 1;
  int64_t r = 0;
  for (; r + RB <= out; r += RB) rows_block<RB, NT>(y, ldy, xs, packed, scales, r, in, accumulate);
  for (; r < out; ++r) rows_block<1, NT>(y, ldy, xs, packed, scales, r, in, accumulate);
}

// x rows [nt, in] -> xs [nt, in] in GroupDecoder's order: lane 4 beta + i of vector
// 4n + 2h + s of a group holds its element 2 (8h + 2i + s) + (n kBlocks + beta).
void split_even_odd(float* xs, const float* x, int64_t nt, int64_t in, int64_t /*L*/) {
  int perm[32];
  for (int v = 0; v < kGroupVecs; ++v)
    for (int l = 0; l < kLanes; ++l) {
      const int n = v / 4, h = (v >> 1) & 1, s = v & 1, beta = l / 4, i = l % 4;
      perm[v * kLanes + l] = 2 * (8 * h + 2 * i + s) + n * int(kBlocks) + beta;
    }
  for (int64_t i = 0; i < nt * in; i += 32)
    for (int j = 0; j < 32; ++j) xs[i + j] = x[i + perm[j]];
}

#else  // HWY_SCALAR: one lane; the float table decode

// RB weight rows [r0, r0 + RB) against NT split rows of x.
template <int RB, int NT>
HWY_INLINE void rows_block(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales,
                           int64_t r0, int64_t in, bool accumulate) {
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d)), G = in / 32, row_bytes = in / 2;
  VF acc[RB][NT];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = hn::Zero(d);
  for (int64_t g = 0; g < G; ++g) {
    Lut lut[RB];
    for (int r = 0; r < RB; ++r) lut[r] = Lut(d, e8m0_to_f32(scales[(r0 + r) * G + g]));
    for (int64_t c = 0; c < 16; c += L) {  // chunks of L bytes = 2L weights
      VF xe[NT], xo[NT];
      for (int t = 0; t < NT; ++t) {
        xe[t] = hn::LoadU(d, xs + t * in + g * 32 + 2 * c);
        xo[t] = hn::LoadU(d, xs + t * in + g * 32 + 2 * c + L);
      }
      for (int r = 0; r < RB; ++r) {
        VF we, wo;
        decode_chunk(d, packed + (r0 + r) * row_bytes + g * 16 + c, lut[r], &we, &wo);
        for (int t = 0; t < NT; ++t) {
          acc[r][t] = hn::MulAdd(we, xe[t], acc[r][t]);
          acc[r][t] = hn::MulAdd(wo, xo[t], acc[r][t]);
        }
      }
    }
  }
  store_rows<RB, NT>(y, ldy, r0, acc, accumulate);
}

template <int NT>
void all_rows(float* y, int64_t ldy, const float* xs, const uint8_t* packed, const uint8_t* scales, int64_t in,
              int64_t out, bool accumulate) {
  int64_t r = 0;
  for (; r + 4 <= out; r += 4) rows_block<4, NT>(y, ldy, xs, packed, scales, r, in, accumulate);
  for (; r < out; ++r) rows_block<1, NT>(y, ldy, xs, packed, scales, r, in, accumulate);
}

// x rows [nt, in] -> xs [nt, in]: per 2L-chunk the L even then the L odd elements.
void split_even_odd(float* xs, const float* x, int64_t nt, int64_t in, int64_t L) {
  for (int64_t i = 0; i < nt * in; i += 2 * L)
    for (int64_t j = 0; j < L; ++j) {
      xs[i + j] = x[i + 2 * j];
      xs[i + L + j] = x[i + 2 * j + 1];
    }
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace

void Mxfp4Linear(float* y, const float* x, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t in,
                 int64_t out, int64_t ldy, bool accumulate) {
  const int64_t L = int64_t(hn::Lanes(DF()));
  // Per-thread work area (grows once): up to 4 split rows of x.
  thread_local std::vector<float> work;
  if (work.size() < size_t(4 * in)) work.resize(size_t(4 * in));
  float* xs = work.data();
  for (int64_t t0 = 0; t0 < rows; t0 += 4) {
    const int64_t nt = std::min<int64_t>(4, rows - t0);
    split_even_odd(xs, x + t0 * in, nt, in, L);
    float* yt = y + t0 * ldy;
    switch (nt) {
      case 1: all_rows<1>(yt, ldy, xs, packed, scales, in, out, accumulate); break;
      case 2: all_rows<2>(yt, ldy, xs, packed, scales, in, out, accumulate); break;
      case 3: all_rows<3>(yt, ldy, xs, packed, scales, in, out, accumulate); break;
      default: all_rows<4>(yt, ldy, xs, packed, scales, in, out, accumulate); break;
    }
  }
}

void Mxfp4Dequantize(float* dst, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols) {
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d)), G = cols / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < G; ++g) {
      const Lut lut(d, e8m0_to_f32(scales[r * G + g]));
      for (int64_t c = 0; c < 16; c += L) {
        VF e, o;
        decode_chunk(d, packed + r * (cols / 2) + g * 16 + c, lut, &e, &o);
        hn::StoreInterleaved2(e, o, d, dst + r * cols + g * 32 + 2 * c);  // element 2j, 2j + 1
      }
    }
}

}  // namespace HWY_NAMESPACE
}  // namespace k3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3 {

HWY_EXPORT(Mxfp4Linear);
HWY_EXPORT(Mxfp4Dequantize);

namespace {
void check_shape(int64_t in) { K3_ASSERT(in > 0 && in % 32 == 0, "mxfp4: the input width must be a multiple of 32"); }
}  // namespace

void mxfp4_linear(float* y, const float* x, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t in,
                  int64_t out, int64_t ldy, bool accumulate) {
  check_shape(in);
  K3_ASSERT(ldy >= out, "mxfp4_linear: ldy < out");
  HWY_DYNAMIC_DISPATCH(Mxfp4Linear)(y, x, packed, scales, rows, in, out, ldy, accumulate);
}

template <typename T>
void mxfp4_linear_reference(T* y, const T* x, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t in,
                            int64_t out, int64_t ldy, bool accumulate) {
  check_shape(in);
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t r = 0; r < out; ++r) {
    mxfp4_decode_row(packed + r * (in / 2), scales + r * (in / 32), row.data(), size_t(in));
    for (int64_t t = 0; t < rows; ++t) {
      double acc = 0;
      for (int64_t c = 0; c < in; ++c) acc += double(row[c]) * double(x[t * in + c]);
      y[t * ldy + r] = accumulate ? T(double(y[t * ldy + r]) + acc) : T(acc);
    }
  }
}

void mxfp4_dequantize(float* dst, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols) {
  check_shape(cols);
  HWY_DYNAMIC_DISPATCH(Mxfp4Dequantize)(dst, packed, scales, rows, cols);
}

template <typename T>
void mxfp4_dequantize_reference(T* dst, const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols) {
  check_shape(cols);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    mxfp4_decode_row(packed + r * (cols / 2), scales + r * (cols / 32), row.data(), size_t(cols));
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = T(row[c]);
  }
}

template void mxfp4_linear_reference<float>(float*, const float*, const uint8_t*, const uint8_t*, int64_t, int64_t,
                                            int64_t, int64_t, bool);
template void mxfp4_linear_reference<double>(double*, const double*, const uint8_t*, const uint8_t*, int64_t, int64_t,
                                             int64_t, int64_t, bool);
template void mxfp4_dequantize_reference<float>(float*, const uint8_t*, const uint8_t*, int64_t, int64_t);
template void mxfp4_dequantize_reference<double>(double*, const uint8_t*, const uint8_t*, int64_t, int64_t);

}  // namespace k3
#endif  // HWY_ONCE
