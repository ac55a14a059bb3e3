// A host emulation of the CUDA primitives that src/cuda/kernels/kda_chunk_kernel.cuh uses, so
// that the kernel's own code runs on a machine without a GPU (test_kda_chunk_emulated.cpp): one
// fiber (ucontext) per CUDA thread of a block, all on the calling host thread, __syncthreads as
// a barrier of the block's fibers, and the warp collectives (shuffles, ldmatrix, mma.sync
// m16n8k16) as exchanges through per-warp slots with a barrier of the warp's 32 fibers on each
// side. Fibers run in a fixed order (forward or reverse, the caller's choice) until they block,
// so a missing __syncthreads shows as a read of stale data in one of the two orders. The collectives follow the PTX ISA's fragment
// layouts (kda_chunk_mma.cuh); what this checks is the kernel's indexing, phases, barriers and
// arithmetic, not the hardware. Shared memory starts as NaN bytes; cp.async copies land either
// when issued (catches a copy into memory still being read) or at the wait (catches a read
// before the wait), as the caller chooses.
#pragma once
#define K3_KDA_EMULATED 1

#include <ucontext.h>

#include <exception>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define K3_KDA_DYNAMIC_SMEM(name) unsigned char* name = ::k3::emu::block().smem.data()
#define K3_KDA_UNROLL(n)
#define threadIdx (::k3::emu::fiber().idx)
#define blockIdx (::k3::emu::block().idx)

struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline uint16_t emu_f32_to_bf16(float f) {  // nearest even, NaN kept
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float emu_bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {emu_f32_to_bf16(f)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {{emu_f32_to_bf16(a)}, {emu_f32_to_bf16(b)}}; }

namespace k3::emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

constexpr int kBlockThreads = 256;
constexpr size_t kFiberStack = 256 << 10;

struct Barrier {
  int n, count = 0;
  unsigned gen = 0;
};

struct Warp {
  Barrier bar{32};
  const void* addr[32];
  uint32_t a[32][4], b[32][2];
  float f[32];
};

struct Copy {
  void* dst;
  const void* src;
  int bytes;
  bool valid;
};

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  Dim3 idx;
  bool done = false;
  const Barrier* waiting = nullptr;
  unsigned wait_gen = 0;
  std::vector<Copy> open;               // cp.async issued, not yet committed
  std::deque<std::vector<Copy>> groups;  // committed, oldest first
};

struct Block {
  Block(size_t bytes, bool lazy) : smem(bytes), lazy_copies(lazy) {
    std::memset(smem.data(), 0xff, bytes);  // NaN floats, NaN bf16
  }
  Barrier bar{kBlockThreads};
  std::vector<unsigned char> smem;
  Warp warps[kBlockThreads / 32];
  bool lazy_copies;
  Dim3 idx;
  Fiber fibers[kBlockThreads];
  Fiber* cur = nullptr;
  ucontext_t sched;
  std::exception_ptr error;
  void* kernel_fn = nullptr;
};

// swapcontext behind a call the compiler does not see through: it returns twice, like setjmp,
// and the callers' variables would otherwise be flagged as clobbered.
[[gnu::noinline]] inline void switch_context(ucontext_t* from, ucontext_t* to) { swapcontext(from, to); }

// A fiber that will start in `entry` on its own stack (getcontext returns twice, as above).
[[gnu::noinline]] inline void start_fiber(Fiber& f, void (*entry)()) {
  f.stack = std::make_unique<char[]>(kFiberStack);
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = kFiberStack;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, entry, 0);
}

inline Block*& current_block() {
  static Block* b = nullptr;
  return b;
}
inline Block& block() { return *current_block(); }
inline Fiber& fiber() { return *block().cur; }

// Arrive; the last arrival releases the others and goes on, the others yield to the scheduler.
inline void arrive_and_wait(Barrier& b) {
  if (++b.count == b.n) {
    b.count = 0;
    ++b.gen;
    return;
  }
  Fiber& f = fiber();
  f.waiting = &b;
  f.wait_gen = b.gen;
  switch_context(&f.ctx, &block().sched);
}

}  // namespace k3::emu

inline void __syncthreads() { k3::emu::arrive_and_wait(k3::emu::block().bar); }

inline float __shfl_xor_sync(unsigned, float v, int m) {
  auto& w = k3::emu::block().warps[threadIdx.x / 32];
  const int lane = threadIdx.x % 32;
  w.f[lane] = v;
  k3::emu::arrive_and_wait(w.bar);
  const float r = w.f[lane ^ m];
  k3::emu::arrive_and_wait(w.bar);
  return r;
}

namespace k3::cuda::kda {

using SmemAddr = const void*;
inline SmemAddr smem_addr(const void* p) { return p; }

inline void emu_check_smem(const void* p, size_t bytes, size_t align) {
  const auto& s = k3::emu::block().smem;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < s.data() || c + bytes > s.data() + s.size())
    throw std::logic_error("emulated kernel: shared-memory access outside the block's allocation");
  if (reinterpret_cast<uintptr_t>(p) % align)
    throw std::logic_error("emulated kernel: misaligned shared-memory access");
}

inline void emu_ldsm(uint32_t (&r)[4], SmemAddr addr, bool trans) {
  emu_check_smem(addr, 16, 16);
  auto& w = k3::emu::block().warps[threadIdx.x / 32];
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  w.addr[lane] = addr;
  k3::emu::arrive_and_wait(w.bar);
  for (int j = 0; j < 4; ++j) {
    uint16_t lo, hi;
    if (!trans) {  // row g, columns 2t, 2t + 1
      const auto* row = static_cast<const uint16_t*>(w.addr[8 * j + g]);
      lo = row[2 * t], hi = row[2 * t + 1];
    } else {  // rows 2t, 2t + 1, column g
      lo = static_cast<const uint16_t*>(w.addr[8 * j + 2 * t])[g];
      hi = static_cast<const uint16_t*>(w.addr[8 * j + 2 * t + 1])[g];
    }
    r[j] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  k3::emu::arrive_and_wait(w.bar);
}
inline void ldsm_x4(uint32_t (&r)[4], SmemAddr addr) { emu_ldsm(r, addr, false); }
inline void ldsm_x4_t(uint32_t (&r)[4], SmemAddr addr) { emu_ldsm(r, addr, true); }

inline float emu_half(uint32_t reg, int hi) { return emu_bf16_to_f32(uint16_t(hi ? reg >> 16 : reg & 0xffffu)); }

inline void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  auto& w = k3::emu::block().warps[threadIdx.x / 32];
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
  w.b[lane][0] = b0, w.b[lane][1] = b1;
  k3::emu::arrive_and_wait(w.bar);
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float s = d[i];
    for (int k = 0; k < 16; ++k) {
      const float av = emu_half(w.a[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
      const float bv = emu_half(w.b[col * 4 + (k % 8) / 2][k >= 8], k % 2);
      s += av * bv;
    }
    d[i] = s;
  }
  k3::emu::arrive_and_wait(w.bar);
}

inline uint32_t pack_bf16(float x0, float x1) {
  return uint32_t(emu_f32_to_bf16(x0)) | (uint32_t(emu_f32_to_bf16(x1)) << 16);
}

inline float ex2(float x) {
  const float y = std::exp2(x);
  return y < 1.17549435e-38f ? 0.f : y;  // ex2.approx.ftz
}

inline void emu_do(const k3::emu::Copy& c) {
  if (c.valid)
    std::memcpy(c.dst, c.src, size_t(c.bytes));
  else
    std::memset(c.dst, 0, size_t(c.bytes));
}
inline void emu_cp_async(void* smem, const void* gmem, int bytes, bool valid) {
  emu_check_smem(smem, size_t(bytes), size_t(bytes));
  if (valid && reinterpret_cast<uintptr_t>(gmem) % size_t(bytes))
    throw std::logic_error("emulated kernel: misaligned cp.async source");
  const k3::emu::Copy c{smem, gmem, bytes, valid};
  if (k3::emu::block().lazy_copies)
    k3::emu::fiber().open.push_back(c);
  else
    emu_do(c);
}
inline void cp_async16(void* smem, const void* gmem, bool valid) { emu_cp_async(smem, gmem, 16, valid); }
inline void cp_async4(void* smem, const void* gmem, bool valid) { emu_cp_async(smem, gmem, 4, valid); }
inline void cp_async_commit() {
  k3::emu::fiber().groups.push_back(std::move(k3::emu::fiber().open));
  k3::emu::fiber().open.clear();
}
template <int N>
inline void cp_async_wait_group() {
  while (int(k3::emu::fiber().groups.size()) > N) {
    for (const auto& c : k3::emu::fiber().groups.front()) emu_do(c);
    k3::emu::fiber().groups.pop_front();
  }
}
inline void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait_group<0>();
}

}  // namespace k3::cuda::kda

namespace k3::emu {

template <class F>
void fiber_main() {
  Block& b = block();
  try {
    (*static_cast<F*>(b.kernel_fn))();
    if (!fiber().open.empty() || !fiber().groups.empty())
      throw std::logic_error("emulated kernel: cp.async left pending at exit");
  } catch (...) {
    b.error = std::current_exception();
  }
  fiber().done = true;
  switch_context(&fiber().ctx, &b.sched);
}

// Runs kernel() as blocks 0..nblocks-1 of kBlockThreads fibers each, one block after another,
// with `smem_bytes` of shared memory. Throws what a fiber threw, or on a deadlock (fibers left
// waiting at barriers the others never reach).
template <class F>
void run_blocks(int nblocks, size_t smem_bytes, bool lazy_copies, bool reverse_order, F kernel) {
  for (int bi = 0; bi < nblocks; ++bi) {
    auto blk = std::make_unique<Block>(smem_bytes, lazy_copies);
    blk->idx.x = unsigned(bi);
    blk->kernel_fn = &kernel;
    current_block() = blk.get();
    for (int t = 0; t < kBlockThreads; ++t) {
      Fiber& f = blk->fibers[t];
      f.idx.x = unsigned(t);
      start_fiber(f, &fiber_main<F>);
    }
    for (int left = kBlockThreads; left > 0;) {
      bool ran = false;
      for (int i = 0; i < kBlockThreads; ++i) {
        Fiber& f = blk->fibers[reverse_order ? kBlockThreads - 1 - i : i];
        if (f.done || (f.waiting && f.waiting->gen == f.wait_gen)) continue;
        f.waiting = nullptr;
        blk->cur = &f;
        switch_context(&blk->sched, &f.ctx);
        ran = true;
        if (blk->error) {
          current_block() = nullptr;
          std::rethrow_exception(blk->error);
        }
        if (f.done) --left;
      }
      if (!ran) throw std::logic_error("emulated kernel: deadlock (threads wait at barriers others never reach)");
    }
    current_block() = nullptr;
  }
}

}  // namespace k3::emu
