// mm_bf16 on AVX512-BF16 (vdpbf16ps: one instruction per 16 columns and k pair), the one
// hand-written SIMD kernel: Highway 1.0.3 (Debian 12) has no AVX512-BF16 target, and its
// portable bf16 dot product widens each pair with two shifts and two FMAs, where vdpbf16ps
// does both products and sums in one instruction. Only the functions below are compiled for
// AVX-512 (target attributes), so nothing else in the binary needs the instructions;
// matmul_bf16.cpp calls it only when the CPU has AVX512-BF16 and AVX-512 is not disabled.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/matmul_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#define K3_HAVE_AVX512BF16_KERNEL 1
#include <immintrin.h>
#define K3_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace k3 {

#if defined(K3_HAVE_AVX512BF16_KERNEL)
namespace {

// C[MR, 16*NV] (+)= A[MR, 2*kk0 : 2*kk1] B[...]: one vdpbf16ps per (row, column vector, k pair).
template <int MR, int NV>
K3_BF16_TARGET void ukr(int64_t kk0, int64_t kk1, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb,
                        float* C, int64_t ldc, float alpha, bool accumulate, const float* cs) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t kk = kk0; kk < kk1; ++kk) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(Bp + kk * 2 * ldb + 32 * v);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, A + r * lda + 2 * kk, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      float* c = C + r * ldc + 16 * v;
      __m512 x = acc[r][v];
      if (cs) x = _mm512_mul_ps(x, _mm512_loadu_ps(cs + 16 * v));
      x = accumulate ? _mm512_fmadd_ps(x, va, _mm512_loadu_ps(c)) : _mm512_mul_ps(x, va);
      _mm512_storeu_ps(c, x);
    }
}

using Ukr = void (*)(int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, float, bool,
                     const float*);
constexpr int kMr = 8, kNv = 4;  // MR 8 for up to 2 column vectors, 4 beyond (16 accumulators)
struct Table {
  Ukr f[kMr][kNv];
};
template <int... R>
constexpr Table make_table(std::integer_sequence<int, R...>) {
  Table t{};
  ((t.f[R][0] = &ukr<R + 1, 1>, t.f[R][1] = &ukr<R + 1, 2>, t.f[R][2] = R < 4 ? &ukr<(R < 4 ? R + 1 : 1), 3> : nullptr,
    t.f[R][3] = R < 4 ? &ukr<(R < 4 ? R + 1 : 1), 4> : nullptr),
   ...);
  return t;
}
constexpr Table kTable = make_table(std::make_integer_sequence<int, kMr>{});

}  // namespace

bool mm_bf16_avx512bf16(float* C, int64_t ldc, const uint16_t* A, int64_t lda, const uint16_t* Bp, int64_t ldb,
                        int64_t M, int64_t N, int64_t K, float alpha, bool accumulate, Tri tri, const float* colscale) {
  if (!C) return true;  // probe: the kernel is built
  for (int64_t n0 = 0; n0 < N; n0 += 16 * kNv) {
    const int64_t nv = std::min<int64_t>(kNv, (N - n0) / 16);
    const int64_t mrmax = nv <= 2 ? 8 : 4;
    const float* cs = colscale ? colscale + n0 : nullptr;
    for (int64_t i0 = 0; i0 < M; i0 += mrmax) {
      const int64_t mr = std::min<int64_t>(mrmax, M - i0);
      int64_t k0 = 0, k1 = K;  // rows [i0, i0 + mr) of a triangular A (see Tri)
      if (tri == Tri::Lower) k1 = std::min(K, i0 + mr);
      if (tri == Tri::Upper) k0 = std::min(K, i0);
      const int64_t kk0 = k0 / 2, kk1 = std::max(kk0, (k1 + 1) / 2);
      kTable.f[mr - 1][nv - 1](kk0, kk1, A + i0 * lda, lda, Bp + 2 * n0, ldb, C + i0 * ldc + n0, ldc, alpha, accumulate,
                               cs);
    }
  }
  return true;
}

// The bf16 dot-product peak (kernels/machine_probe.h): 16 vdpbf16ps chains.
K3_BF16_TARGET double bf16_dot_peak_native(int64_t n, float* sink) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = x;
  for (int64_t it = 0; it < n; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
    __asm__ volatile("" : "+v"(x));
  }
  for (int i = 1; i < 16; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  float s = 0;
  for (float v : lanes) s += v;
  *sink = s;
  return double(n) * 16 * 64;
}

#else

double bf16_dot_peak_native(int64_t, float* sink) {
  *sink = 0;
  return 0;
}

bool mm_bf16_avx512bf16(float*, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, int64_t,
                        float, bool, Tri, const float*) {
  return false;
}

#endif

}  // namespace k3
