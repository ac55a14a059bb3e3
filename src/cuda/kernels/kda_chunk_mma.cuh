// Warp-level tensor-core pieces of the chunked KDA kernel (kda_chunk_kernel.cuh;
// docs/cuda-kda.md): bf16 operand tiles in shared memory with an XOR swizzle, ldmatrix loads of
// mma.sync m16n8k16 fragments (bf16 operands, f32 accumulation; sm_80 and later), cp.async
// copies and the base-2 exponential. Fragment layouts are the PTX ISA's for m16n8k16 .row.col:
//   A (16 x 16): reg r holds rows g + 8 (r & 1), cols 2 t + {0, 1} + 8 (r >> 1)
//   B (16 x 8):  reg r holds rows (k) 2 t + {0, 1} + 8 r, col (n) g
//   C (16 x 8):  c[0..1] row g, cols 2 t + {0, 1}; c[2..3] row g + 8
// with g = lane / 4, t = lane % 4 (the low 16 bits of a register hold the lower column / k).
//
// The kernel body is also compiled on the host against an emulation of the primitives
// (tests/cuda/kda_emulator.h: one host thread per lane), which defines K3_KDA_EMULATED and
// provides every name in the #if block below.
#pragma once
#include <cstdint>

#if !defined(K3_KDA_EMULATED)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define K3_KDA_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#define K3_KDA_PRAGMA(x) _Pragma(#x)
#define K3_KDA_UNROLL(n) K3_KDA_PRAGMA(unroll n)  // #pragma unroll [n]

namespace k3::cuda::kda {

using SmemAddr = uint32_t;  // a shared-memory address as ldmatrix takes it
__device__ __forceinline__ SmemAddr smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 b16 matrices; lane l gives the row address of row l % 8 of matrix l / 8 and
// receives, of matrix j, in r[j]: row l / 4, columns 2 (l % 4) + {0, 1} (.trans: the transpose).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], SmemAddr addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], SmemAddr addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d += a b (bf16 x bf16 -> f32).
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16x2 of two floats (lo = x0), nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float x0, float x1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 2^x (MUFU; relative error about 2^-22; +inf above 128; results below 2^-126 flushed to 0,
// as the CPU kernel flushes subnormals).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// cp.async: 16 bytes (global -> shared, through L2 only), zero-filled when !valid (gmem must
// still be a valid address); 4 bytes likewise.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace k3::cuda::kda
#endif  // !K3_KDA_EMULATED

namespace k3::cuda::kda {

// A bf16 matrix in shared memory, row-major with rows of W elements (W = 64 or 128: 8 or 16
// pieces of 16 bytes); piece c of row r is stored at piece c ^ (r & 7). Eight consecutive rows
// of one 16-byte column piece (what one ldmatrix 8 x 8 reads, and what a warp writes from an
// accumulator fragment) then fall in eight different bank groups.
template <int W>
struct SwzTile {
  static_assert(W == 64 || W == 128, "swizzled rows are 64 or 128 bf16 wide");
  __nv_bfloat16* p;
  __device__ __forceinline__ int offset(int r, int c) const { return r * W + (((c >> 3) ^ (r & 7)) << 3) + (c & 7); }
  __device__ __forceinline__ __nv_bfloat16* at(int r, int c) const { return p + offset(r, c); }
  __device__ __forceinline__ SmemAddr saddr(int r, int c) const { return smem_addr(at(r, c)); }
  // Two consecutive elements (c even) from two floats, rounded to nearest even.
  __device__ __forceinline__ void store2(int r, int c, float x0, float x1) const {
    *reinterpret_cast<__nv_bfloat162*>(at(r, c)) = __floats2bfloat162_rn(x0, x1);
  }
};

// Fragment loads; lane = threadIdx.x % 32; (m0, k0), (k0, n0) multiples of 16.
// A [M][K] stored row-major (K contiguous): the m16 x k16 fragment at (m0, k0).
template <int W>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const SwzTile<W>& A, int m0, int k0, int lane) {
  const int mi = lane >> 3;
  ldsm_x4(a, A.saddr(m0 + (lane & 7) + (mi & 1) * 8, k0 + (mi >> 1) * 8));
}
// A stored transposed, [K][M] (M contiguous): the same fragment of A = stored^T.
template <int W>
__device__ __forceinline__ void load_a_t(uint32_t (&a)[4], const SwzTile<W>& At, int m0, int k0, int lane) {
  const int mi = lane >> 3;
  ldsm_x4_t(a, At.saddr(k0 + (lane & 7) + (mi >> 1) * 8, m0 + (mi & 1) * 8));
}
// B [K][N] stored row-major (N contiguous): k16 x n16 at (k0, n0) as two n8 fragments,
// b[0..1] for columns n0..n0+7, b[2..3] for n0+8..n0+15.
template <int W>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const SwzTile<W>& B, int k0, int n0, int lane) {
  const int mi = lane >> 3;
  ldsm_x4_t(b, B.saddr(k0 + (lane & 7) + (mi & 1) * 8, n0 + (mi >> 1) * 8));
}

}  // namespace k3::cuda::kda
