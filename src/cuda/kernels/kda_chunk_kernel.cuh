// The chunked KDA forward kernel (launched by kda_chunk.cu; design and resource figures in
// docs/cuda-kda.md). Contract: kernels/kda_fast.h kda_chunk_fast_forward with chunk 64 and
// bf16 = true, whose equations it follows (per head, chunk of C = 64 tokens, G = in-chunk
// cumulative sum of g, 16-token sub-tiles I with anchor rows a_I, b_I):
//   Akk = StrictLower(K_i . K_j e^(G_i - G_j)),  Aqk = LowerIncl(Q_i . K_j e^(G_i - G_j)),
//   Tm  = (I + diag(beta) Akk)^-1 diag(beta),   R = V - (K e^G) S,   V' = Tm R,
//   O   = (Q e^G) S + Aqk V',   S = diag(e^G_last) S + (K e^(G_last - G))^T V'.
// Tile (I, J) of [Akk ; Aqk] is the dense product X_I (Y_J f_IJ)^T with X = K e^(G - G_aI),
// Y = K e^(G_bJ - G), f_IJ = e^(G_aI - G_bJ):
//   dense (diag_dense): a_I = b_I = the tile's middle row, every tile including the diagonal
//     ones through the same product (|exponent| <= 8 * 5 = 40 for g >= -5: docs/kda-numerics.md);
//   safe: a_I = 16 I - 1, b_I = 16 I + 15 (every factor <= 1) for J < I, and the diagonal
//     tiles pair by pair in f32 from e^(G_i - G_j) <= 1 (any g <= 0).
// One block of 256 threads per head runs the head's chunks in order; the state S [Dk, Dv]
// stays in f32 registers (the accumulators of its update) and in shared memory as the bf16
// operand of the next chunk. Every matrix product is mma.sync m16n8k16 (bf16 operands, f32
// accumulation); G, the exponentials, the UT forward substitution and S are f32.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/kernels/kda_chunk_mma.cuh"

namespace k3::cuda::kda {

inline constexpr int kC = 64;  // chunk (tokens)
inline constexpr int kThreads = 256;
inline constexpr int kAL = 68;  // row stride (floats) of the f32 64 x 64 matrices Akk, Aqk, Linv
inline constexpr float kLog2e = 1.4426950408889634f;

constexpr size_t cmax(size_t a, size_t b) { return a > b ? a : b; }

// Shared memory of one block, in bytes. The three f32 staging regions receive a chunk's q, k, g
// (and v) by cp.async and are reused for the chunk's intermediates once their contents are dead
// (the phase comments in the kernel say which, and when the next chunk's copies start).
template <int DK, int DV>
struct Layout {
  static constexpr int KP = DK + 8, VP = DV + 8;  // padded f32 row strides (bank-conflict free)
  // RQ: q f32 [64][KP] -> Akk, Aqk f32 [64][kAL] each (Aqk's slot then holds Linv) -> next q
  static constexpr size_t RQ = cmax(size_t(kC) * KP * 4, size_t(2) * kC * kAL * 4);
  // RK: k f32 [64][KP] -> Y = K e^(G_b - G) in place
  static constexpr size_t RK = size_t(kC) * KP * 4;
  // RG: g f32 [64][KP] -> G (log2 units) in place -> v f32 [64][VP] -> R bf16 [64][DV]
  static constexpr size_t RG = cmax(cmax(size_t(kC) * KP * 4, size_t(kC) * VP * 4), size_t(kC) * DV * 2);
  // AT: tile operands [X_I ; Qx_I] bf16 [4 x 32][DK] -> Tm, Aqk bf16 [64][64] each, V' bf16 [64][DV]
  static constexpr size_t AT = cmax(size_t(4 * 32) * DK * 2, size_t(2) * kC * kC * 2 + size_t(kC) * DV * 2);
  static constexpr size_t KQE = size_t(2 * kC) * DK * 2;  // [K e^G ; Q e^G] bf16 [128][DK]
  static constexpr size_t KD = size_t(kC) * DK * 2;       // K e^(G_last - G) bf16 [64][DK]
  static constexpr size_t SB = size_t(DK) * DV * 2;       // S bf16 [DK][DV]
  // small f32 arrays: beta [64], El [DK], eA [4][DK], eL [4][DK], f [6][DK], scan totals [256], M [3][256]
  static constexpr int nEl = 64, nEA = nEl + DK, nEL = nEA + 4 * DK, nF = nEL + 4 * DK, nTot = nF + 6 * DK,
                       nM = nTot + 256, nSmall = nM + 3 * 256;
  static constexpr size_t oRQ = 0, oRK = oRQ + RQ, oRG = oRK + RK, oAT = oRG + RG, oKQE = oAT + AT,
                          oKD = oKQE + KQE, oSB = oKD + KD, oSmall = oSB + SB;
  static constexpr size_t kBytes = oSmall + size_t(nSmall) * 4;
  static_assert(RQ % 128 == 0 && RK % 128 == 0 && RG % 128 == 0 && AT % 128 == 0, "region alignment");
};

struct Params {
  float* o;
  float* state;
  const float *q, *k, *v, *g, *beta;
  int64_t T, H;
  float scale;
};

// Anchor rows of sub-tile I: the A side (rows of I: factor e^(G_i - G_a)), -1 = the chunk start
// (G = 0), and the B side (factor e^(G_b - G_j)).
template <bool DENSE>
__device__ __forceinline__ int anchor_a(int I) { return DENSE ? 16 * I + 8 : 16 * I - 1; }
template <bool DENSE>
__device__ __forceinline__ int anchor_b(int I) { return DENSE ? 16 * I + 8 : 16 * I + 15; }
// Index of the off-diagonal tile pair (I, J), J < I, in 0..5.
__device__ __forceinline__ int pair_index(int I, int J) { return I * (I - 1) / 2 + J; }

__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }

// cp.async of rows [t0, t0 + 64) of head h of x [T, H, D] into dst [64][D + 8]; rows >= n are zeros.
template <int D>
__device__ __forceinline__ void load_rows(float* dst, const float* x, int64_t t0, int n, int64_t H, int64_t h,
                                          int tid) {
  constexpr int CPR = D / 4;  // 16-byte pieces per row
K3_KDA_UNROLL(4)
  for (int e = tid; e < kC * CPR; e += kThreads) {
    const int i = e / CPR, c = e % CPR;
    const bool ok = i < n;
    const float* src = ok ? x + ((t0 + i) * H + h) * D + 4 * c : x;
    cp_async16(dst + i * (D + 8) + 4 * c, src, ok);
  }
}
__device__ __forceinline__ void load_beta(float* dst, const float* beta, int64_t t0, int n, int64_t H, int64_t h,
                                          int tid) {
  if (tid < kC) {
    const bool ok = tid < n;
    cp_async4(dst + tid, ok ? beta + (t0 + tid) * H + h : beta, ok);
  }
}

// f(mt, nt, hf, r, c) for each half hf of each m16n8 accumulator fragment (mt, nt) of an
// MT x NT grid with its corner at (m0, n0): the half holds acc[mt][nt][2 hf], [2 hf + 1], at row
// r, columns c and c + 1.
template <int MT, int NT, class F>
__device__ __forceinline__ void for_frags(int m0, int n0, int lane, F f) {
  const int gq = lane >> 2, tq = lane & 3;
K3_KDA_UNROLL()
  for (int mt = 0; mt < MT; ++mt)
K3_KDA_UNROLL()
    for (int nt = 0; nt < NT; ++nt)
K3_KDA_UNROLL()
      for (int hf = 0; hf < 2; ++hf) f(mt, nt, hf, m0 + 16 * mt + gq + 8 * hf, n0 + 8 * nt + 2 * tq);
}
// The grid of fragments to a bf16 tile.
template <int MT, int NT, int W>
__device__ __forceinline__ void store_frags(const SwzTile<W>& dst, const float (&acc)[MT][NT][4], int m0, int n0,
                                            int lane) {
  for_frags<MT, NT>(m0, n0, lane, [&](int mt, int nt, int hf, int r, int c) {
    dst.store2(r, c, acc[mt][nt][2 * hf], acc[mt][nt][2 * hf + 1]);
  });
}

template <int DK, int DV, bool DENSE>
__global__ void __launch_bounds__(kThreads, 1) kda_chunk_kernel(Params p) {
  using L = Layout<DK, DV>;
  constexpr int KP = L::KP, VP = L::VP;
  K3_KDA_DYNAMIC_SMEM(smem);
  float* const sQ = reinterpret_cast<float*>(smem + L::oRQ);
  float* const sK = reinterpret_cast<float*>(smem + L::oRK);
  float* const sG = reinterpret_cast<float*>(smem + L::oRG);
  float* const sSmall = reinterpret_cast<float*>(smem + L::oSmall);
  float* const sBeta = sSmall;
  float* const sEl = sSmall + L::nEl;
  float* const sEA = sSmall + L::nEA;
  float* const sEL = sSmall + L::nEL;
  float* const sF = sSmall + L::nF;
  float* const sTot = sSmall + L::nTot;
  float* const sM = sSmall + L::nM;
  float* const sAkk = sQ;             // f32 [64][kAL], after q is dead
  float* const sAqk = sQ + kC * kAL;  // f32 [64][kAL]; Linv after Aqk went to bf16
  float* const sLinv = sAqk;
  const float* const sV = sG;  // v f32 [64][VP], after G is dead
  const SwzTile<DK> tA{reinterpret_cast<__nv_bfloat16*>(smem + L::oAT)};
  const SwzTile<64> tTm{reinterpret_cast<__nv_bfloat16*>(smem + L::oAT)};
  const SwzTile<64> tAqk{reinterpret_cast<__nv_bfloat16*>(smem + L::oAT) + kC * kC};
  const SwzTile<DK> tKQE{reinterpret_cast<__nv_bfloat16*>(smem + L::oKQE)};
  const SwzTile<DK> tKd{reinterpret_cast<__nv_bfloat16*>(smem + L::oKD)};
  const SwzTile<DV> tSb{reinterpret_cast<__nv_bfloat16*>(smem + L::oSB)};
  const SwzTile<DV> tR{reinterpret_cast<__nv_bfloat16*>(smem + L::oRG)};
  const SwzTile<DV> tVp{reinterpret_cast<__nv_bfloat16*>(smem + L::oAT) + 2 * kC * kC};

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
  const int64_t h = blockIdx.x, H = p.H, T = p.T;
  const int NT = int((T + kC - 1) / kC);
  const float sc = p.scale;

  // The state's accumulator tile of this warp: rows (key channels) [mS0, mS0 + DK/4), columns
  // (value channels) [nS0, nS0 + DV/2).
  constexpr int MTS = DK / 64, NTS = DV / 16;
  const int mS0 = (warp >> 1) * (DK / 4), nS0 = (warp & 1) * (DV / 2);
  float accS[MTS][NTS][4];
  for_frags<MTS, NTS>(mS0, nS0, lane, [&](int mt, int nt, int hf, int r, int c) {
    float2 s = make_float2(0.f, 0.f);
    if (p.state) s = ld2(p.state + (h * DK + r) * DV + c);
    accS[mt][nt][2 * hf] = s.x;
    accS[mt][nt][2 * hf + 1] = s.y;
    tSb.store2(r, c, s.x, s.y);
  });

  // Output tiles of the 64 x DV products (R, V', O): warp rows [mO0, mO0 + 32), columns
  // [nO0, nO0 + DV/4).
  constexpr int NTO = DV / 32;
  const int wmO = warp >> 2, mO0 = 32 * wmO, nO0 = (warp & 3) * (DV / 4);

  {  // chunk 0's inputs
    const int n0 = int(std::min<int64_t>(kC, T));
    load_rows<DK>(sQ, p.q, 0, n0, H, h, tid);
    load_rows<DK>(sK, p.k, 0, n0, H, h, tid);
    load_rows<DK>(sG, p.g, 0, n0, H, h, tid);
    load_beta(sBeta, p.beta, 0, n0, H, h, tid);
    cp_async_commit();
  }

  for (int c = 0; c < NT; ++c) {
    const int64_t t0 = int64_t(c) * kC;
    const int n = int(std::min<int64_t>(kC, T - t0));
    const int64_t t1 = t0 + kC;
    const int n1 = c + 1 < NT ? int(std::min<int64_t>(kC, T - t1)) : 0;
    cp_async_wait_all();
    __syncthreads();

    // ---- P1: G = cumsum(g) over the chunk's rows, per key channel, in log2 units, in place.
    {
      constexpr int NS = kThreads / DK, LEN = kC / NS;
      const int d = tid % DK, s = tid / DK;
      float* col = sG + s * LEN * KP + d;
      float run = 0.f;
K3_KDA_UNROLL()
      for (int r = 0; r < LEN; ++r) {
        run += col[r * KP];
        col[r * KP] = run;
      }
      sTot[s * DK + d] = run;
      __syncthreads();
      float off = 0.f;
      for (int s2 = 0; s2 < s; ++s2) off += sTot[s2 * DK + d];
K3_KDA_UNROLL()
      for (int r = 0; r < LEN; ++r) col[r * KP] = (col[r * KP] + off) * kLog2e;
      __syncthreads();
    }

    // ---- P1b (safe path): the diagonal tiles pair by pair, f32, from e^(G_i - G_j) <= 1.
    // Warp w: tile I = w / 2; lane: row pair (r1, r2) = (ii, 15 - ii) of the tile, channel part
    // p (channels 32 c + 4 p .. + 3). Pair s of the thread's 17: (r1, s) for s <= ii, else
    // (r2, s - ii - 1). The sums over channels are completed across the 8 parts by shuffles;
    // lane p keeps pairs s = p, p + 8, p + 16 for P3 to store (q is still being read now).
    float dAk[3] = {0.f, 0.f, 0.f}, dAq[3] = {0.f, 0.f, 0.f};
    if constexpr (!DENSE) {
      const int I = warp >> 1, ii = (warp & 1) * 4 + (lane >> 3), part = lane & 7;
      const int r1 = 16 * I + ii, r2 = 16 * I + 15 - ii;
      float ak[17], aq[17];
K3_KDA_UNROLL()
      for (int s = 0; s < 17; ++s) ak[s] = aq[s] = 0.f;
K3_KDA_UNROLL(1)
      for (int cc = 0; cc < DK / 32; ++cc) {
        const int d = 32 * cc + 4 * part;
        const float4 k1 = ld4(sK + r1 * KP + d), q1 = ld4(sQ + r1 * KP + d), g1 = ld4(sG + r1 * KP + d);
        const float4 k2 = ld4(sK + r2 * KP + d), q2 = ld4(sQ + r2 * KP + d), g2 = ld4(sG + r2 * KP + d);
K3_KDA_UNROLL()
        for (int s = 0; s < 17; ++s) {
          const bool first = s <= ii;
          const int j = 16 * I + (first ? s : s - ii - 1);
          const float4 kj = ld4(sK + j * KP + d), gj = ld4(sG + j * KP + d);
          const float4 ki = first ? k1 : k2, qi = first ? q1 : q2, gi = first ? g1 : g2;
          const float t0x = kj.x * ex2(gi.x - gj.x), t0y = kj.y * ex2(gi.y - gj.y);
          const float t0z = kj.z * ex2(gi.z - gj.z), t0w = kj.w * ex2(gi.w - gj.w);
          ak[s] += ki.x * t0x + ki.y * t0y + ki.z * t0z + ki.w * t0w;
          aq[s] += qi.x * t0x + qi.y * t0y + qi.z * t0z + qi.w * t0w;
        }
      }
K3_KDA_UNROLL()
      for (int s = 0; s < 17; ++s) {
K3_KDA_UNROLL()
        for (int m = 1; m < 8; m <<= 1) {
          ak[s] += __shfl_xor_sync(0xffffffffu, ak[s], m);
          aq[s] += __shfl_xor_sync(0xffffffffu, aq[s], m);
        }
        if (s % 8 == part) {
          dAk[s / 8] = ak[s];
          dAq[s / 8] = aq[s] * sc;
        }
      }
    }

    // ---- P1c: per-tile factors (El = e^G_last, eA = e^G_a, eL = e^(G_last - G_b), f_IJ).
    {
      const float* Gl = sG + (kC - 1) * KP;
      for (int e = tid; e < 15 * DK; e += kThreads) {
        const int w = e / DK, d = e % DK;
        float val;
        if (w == 0) {
          val = ex2(Gl[d]);
        } else if (w <= 4) {
          const int a = anchor_a<DENSE>(w - 1);
          val = a < 0 ? 1.f : ex2(sG[a * KP + d]);
        } else if (w <= 8) {
          val = ex2(Gl[d] - sG[anchor_b<DENSE>(w - 5) * KP + d]);
        } else {
          const int pi = w - 9, I = pi < 1 ? 1 : pi < 3 ? 2 : 3, J = pi - pair_index(I, 0);
          const int a = anchor_a<DENSE>(I);
          val = ex2((a < 0 ? 0.f : sG[a * KP + d]) - sG[anchor_b<DENSE>(J) * KP + d]);
        }
        sSmall[L::nEl + e] = val;  // El, eA, eL, f are consecutive DK-rows
      }
    }
    __syncthreads();

    // ---- P2: bf16 operands. Per element (i, d): x = e^(G_i - G_a), y = e^(G_b - G_i);
    // X = K x, Qx = sc Q x (tile A rows), K e^G = X eA, Q e^G = Qx eA, Kd = K y eL, and the
    // f32 Y = K y in place of K (tile B, scaled per tile pair in P3).
    {
      constexpr int PPR = DK / 2;
K3_KDA_UNROLL(4)
      for (int e = tid; e < kC * PPR; e += kThreads) {
        const int i = e / PPR, d = 2 * (e % PPR), I = i >> 4, il = i & 15;
        const int a = anchor_a<DENSE>(I), b = anchor_b<DENSE>(I);
        const float2 gi = ld2(sG + i * KP + d), gb = ld2(sG + b * KP + d);
        const float2 ga = a < 0 ? make_float2(0.f, 0.f) : ld2(sG + a * KP + d);
        const float2 kk = ld2(sK + i * KP + d), qq = ld2(sQ + i * KP + d);
        const float2 eA = ld2(sEA + I * DK + d), eL = ld2(sEL + I * DK + d);
        const float x0 = ex2(gi.x - ga.x), x1 = ex2(gi.y - ga.y);
        const float y0 = ex2(gb.x - gi.x), y1 = ex2(gb.y - gi.y);
        const float X0 = kk.x * x0, X1 = kk.y * x1, Q0 = sc * qq.x * x0, Q1 = sc * qq.y * x1;
        tA.store2(32 * I + il, d, X0, X1);
        tA.store2(32 * I + 16 + il, d, Q0, Q1);
        tKQE.store2(i, d, X0 * eA.x, X1 * eA.y);
        tKQE.store2(kC + i, d, Q0 * eA.x, Q1 * eA.y);
        const float Y0 = kk.x * y0, Y1 = kk.y * y1;
        tKd.store2(i, d, Y0 * eL.x, Y1 * eL.y);
        st2(sK + i * KP + d, Y0, Y1);
      }
    }
    __syncthreads();

    // ---- P3: v of this chunk into RG (G is dead); the [Akk ; Aqk] tiles into RQ (q is dead).
    load_rows<DV>(sG, p.v, t0, n, H, h, tid);
    cp_async_commit();
    {
      // Units (I, J, half): an m16 x n16 output tile, half 0 = Akk rows, 1 = Aqk rows.
      constexpr int NU = DENSE ? 20 : 12;
      for (int u = warp; u < NU; u += kThreads / 32) {
        const int hsel = u & 1, pr = u >> 1;
        int I, J;
        if (DENSE) {  // (0,0) (1,0) (1,1) (2,0) (2,1) (2,2) (3,0) ...
          I = pr < 1 ? 0 : pr < 3 ? 1 : pr < 6 ? 2 : 3;
          J = pr - I * (I + 1) / 2;
        } else {  // (1,0) (2,0) (2,1) (3,0) (3,1) (3,2)
          I = pr < 1 ? 1 : pr < 3 ? 2 : 3;
          J = pr - pair_index(I, 0);
        }
        const float* F = I == J ? nullptr : sF + pair_index(I, J) * DK;
        float acc[2][4] = {};
K3_KDA_UNROLL(2)
        for (int k0 = 0; k0 < DK; k0 += 16) {
          uint32_t a[4];
          load_a(a, tA, 32 * I + 16 * hsel, k0, lane);
          const int kk = k0 + 2 * tq;
          float2 f0 = make_float2(1.f, 1.f), f1 = f0;
          if (F) f0 = ld2(F + kk), f1 = ld2(F + kk + 8);
K3_KDA_UNROLL()
          for (int nt = 0; nt < 2; ++nt) {
            const float* y = sK + (16 * J + 8 * nt + gq) * KP + kk;
            const float2 y0 = ld2(y), y1 = ld2(y + 8);
            mma16816(acc[nt], a, pack_bf16(y0.x * f0.x, y0.y * f0.y), pack_bf16(y1.x * f1.x, y1.y * f1.y));
          }
        }
        float* dst = hsel ? sAqk : sAkk;
K3_KDA_UNROLL()
        for (int nt = 0; nt < 2; ++nt) {
          const int r = 16 * I + gq, cl = 16 * J + 8 * nt + 2 * tq;
          st2(dst + r * kAL + cl, acc[nt][0], acc[nt][1]);
          st2(dst + (r + 8) * kAL + cl, acc[nt][2], acc[nt][3]);
        }
      }
      if constexpr (!DENSE) {  // the diagonal tiles from P1b
        const int I = warp >> 1, ii = (warp & 1) * 4 + (lane >> 3), part = lane & 7;
K3_KDA_UNROLL()
        for (int u = 0; u < 3; ++u) {
          const int s = part + 8 * u;
          if (s < 17) {
            const bool first = s <= ii;
            const int r = 16 * I + (first ? ii : 15 - ii), j = 16 * I + (first ? s : s - ii - 1);
            sAkk[r * kAL + j] = dAk[u];
            sAqk[r * kAL + j] = dAq[u];
          }
        }
      }
    }
    __syncthreads();

    // ---- P4: UT transform, f32. Linv = (I + diag(beta) Akk)^-1 by 16 x 16 blocks: the
    // diagonal blocks by forward substitution (one column per thread, in registers), then
    // Linv_IJ = -Linv_II diag(beta_I) sum_{K=J..I-1} Akk_IK Linv_KJ by block distance.
    // Tm = Linv diag(beta) and Aqk (masked, lower incl.) go to bf16 in AT (the tile operands are
    // dead). RK (Y) is dead: the next chunk's k starts arriving.
    load_rows<DK>(sK, p.k, t1, n1, H, h, tid);
    cp_async_commit();
    {
      float x[16];
      if (warp < 2) {
        const int I = tid >> 4, m = tid & 15;
        const float* A = sAkk + 16 * I * kAL + 16 * I;
K3_KDA_UNROLL()
        for (int i = 0; i < 16; ++i) {
          float s = 0.f;
K3_KDA_UNROLL()
          for (int j = 0; j < i; ++j) s += A[i * kAL + j] * x[j];
          x[i] = (i == m ? 1.f : 0.f) - sBeta[16 * I + i] * s;
        }
      } else {
        for (int e = tid - 64; e < kC * kC / 2; e += kThreads - 64) {
          const int i = e / (kC / 2), j = 2 * (e % (kC / 2));
          tAqk.store2(i, j, j <= i ? sAqk[i * kAL + j] : 0.f, j + 1 <= i ? sAqk[i * kAL + j + 1] : 0.f);
          if ((j >> 4) > (i >> 4)) tTm.store2(i, j, 0.f, 0.f);
        }
      }
      __syncthreads();
      if (warp < 2) {
        const int I = tid >> 4, m = tid & 15;
        const float bm = sBeta[16 * I + m];
K3_KDA_UNROLL()
        for (int i = 0; i < 16; ++i) {
          sLinv[(16 * I + i) * kAL + 16 * I + m] = x[i];
          *tTm.at(16 * I + i, 16 * I + m) = __float2bfloat16_rn(x[i] * bm);
        }
      }
      __syncthreads();
K3_KDA_UNROLL(1)
      for (int lev = 1; lev <= 3; ++lev) {
        const int nb = 4 - lev;
        for (int e = tid; e < nb * 256; e += kThreads) {
          const int J = e >> 8, I = J + lev, r = (e >> 4) & 15, cl = e & 15;
          float s = 0.f;
          for (int K = J; K < I; ++K) {
            const float* A = sAkk + (16 * I + r) * kAL + 16 * K;
            const float* Lk = sLinv + 16 * K * kAL + 16 * J + cl;
K3_KDA_UNROLL()
            for (int t = 0; t < 16; ++t) s += A[t] * Lk[t * kAL];
          }
          sM[e] = s;
        }
        __syncthreads();
        for (int e = tid; e < nb * 256; e += kThreads) {
          const int J = e >> 8, I = J + lev, r = (e >> 4) & 15, cl = e & 15;
          const float* Li = sLinv + (16 * I + r) * kAL + 16 * I;
          const float* Mb = sM + (e & ~255) + cl;
          float s = 0.f;
K3_KDA_UNROLL()
          for (int t = 0; t < 16; ++t) s += Li[t] * sBeta[16 * I + t] * Mb[t * 16];
          sLinv[(16 * I + r) * kAL + 16 * J + cl] = -s;
          *tTm.at(16 * I + r, 16 * J + cl) = __float2bfloat16_rn(-s * sBeta[16 * J + cl]);
        }
        if (lev == 3) cp_async_wait_group<1>();  // this chunk's v (the next k may still fly)
        __syncthreads();
      }
    }
    // RQ (Akk, Linv) is dead: the next chunk's q.
    load_rows<DK>(sQ, p.q, t1, n1, H, h, tid);
    cp_async_commit();

    // ---- P5: R = V - (K e^G) S  (64 x DV, K = DK), bf16 into RG over v.
    float acc[2][NTO][4];
    auto zero_acc = [&] {
K3_KDA_UNROLL()
      for (int mt = 0; mt < 2; ++mt)
K3_KDA_UNROLL()
        for (int nt = 0; nt < NTO; ++nt)
K3_KDA_UNROLL()
          for (int z = 0; z < 4; ++z) acc[mt][nt][z] = 0.f;
    };
    // acc += A[m0.., k0..k1) B[k0..k1), n0..)], A [M][K] swizzled, B [K][N] swizzled.
    auto mma_rows = [&](const auto& A, int am0, const auto& B, int k0, int k1) {
K3_KDA_UNROLL(2)
      for (int kk = k0; kk < k1; kk += 16) {
        uint32_t a[2][4];
        load_a(a[0], A, am0, kk, lane);
        load_a(a[1], A, am0 + 16, kk, lane);
K3_KDA_UNROLL()
        for (int np = 0; np < NTO / 2; ++np) {
          uint32_t b[4];
          load_b_kn(b, B, kk, nO0 + 16 * np, lane);
K3_KDA_UNROLL()
          for (int mt = 0; mt < 2; ++mt) {
            mma16816(acc[mt][2 * np], a[mt], b[0], b[1]);
            mma16816(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    };
    zero_acc();
    mma_rows(tKQE, mO0, tSb, 0, DK);
    for_frags<2, NTO>(mO0, nO0, lane, [&](int mt, int nt, int hf, int r, int cl) {
      const float2 vv = ld2(sV + r * VP + cl);
      acc[mt][nt][2 * hf] = vv.x - acc[mt][nt][2 * hf];
      acc[mt][nt][2 * hf + 1] = vv.y - acc[mt][nt][2 * hf + 1];
    });
    __syncthreads();  // every read of v is done before R overwrites it
    store_frags(tR, acc, mO0, nO0, lane);
    __syncthreads();

    // ---- P6: V' = Tm R (Tm lower block-triangular: rows of tile pair wmO need K < 32 (wmO + 1)),
    // bf16 into AT beside Tm and Aqk. Then RG (R) is dead: the next chunk's g and beta.
    const int kTri = 32 * (wmO + 1);
    zero_acc();
    mma_rows(tTm, mO0, tR, 0, kTri);
    store_frags(tVp, acc, mO0, nO0, lane);
    __syncthreads();
    load_rows<DK>(sG, p.g, t1, n1, H, h, tid);
    load_beta(sBeta, p.beta, t1, n1, H, h, tid);
    cp_async_commit();

    // ---- P7: O = (Q e^G) S + Aqk V' (rows < n to o).
    zero_acc();
    mma_rows(tKQE, kC + mO0, tSb, 0, DK);
    mma_rows(tAqk, mO0, tVp, 0, kTri);
    for_frags<2, NTO>(mO0, nO0, lane, [&](int mt, int nt, int hf, int r, int cl) {
      if (r < n) st2(p.o + ((t0 + r) * H + h) * DV + cl, acc[mt][nt][2 * hf], acc[mt][nt][2 * hf + 1]);
    });

    // ---- P8: S = diag(e^G_last) S + Kd^T V' (DK x DV, K = 64), in the state registers.
K3_KDA_UNROLL()
    for (int mt = 0; mt < MTS; ++mt)
K3_KDA_UNROLL()
      for (int hf = 0; hf < 2; ++hf) {
        const float el = sEl[mS0 + 16 * mt + gq + 8 * hf];
K3_KDA_UNROLL()
        for (int nt = 0; nt < NTS; ++nt) {
          accS[mt][nt][2 * hf] *= el;
          accS[mt][nt][2 * hf + 1] *= el;
        }
      }
K3_KDA_UNROLL()
    for (int k0 = 0; k0 < kC; k0 += 16) {
      uint32_t a[MTS][4];
K3_KDA_UNROLL()
      for (int mt = 0; mt < MTS; ++mt) load_a_t(a[mt], tKd, mS0 + 16 * mt, k0, lane);
K3_KDA_UNROLL()
      for (int np = 0; np < NTS / 2; ++np) {
        uint32_t b[4];
        load_b_kn(b, tVp, k0, nS0 + 16 * np, lane);
K3_KDA_UNROLL()
        for (int mt = 0; mt < MTS; ++mt) {
          mma16816(accS[mt][2 * np], a[mt], b[0], b[1]);
          mma16816(accS[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // S's bf16 copy is read no more this chunk
    store_frags(tSb, accS, mS0, nS0, lane);
  }
  cp_async_wait_all();

  if (p.state)
    for_frags<MTS, NTS>(mS0, nS0, lane, [&](int mt, int nt, int hf, int r, int cl) {
      st2(p.state + (h * DK + r) * DV + cl, accS[mt][nt][2 * hf], accS[mt][nt][2 * hf + 1]);
    });
}

}  // namespace k3::cuda::kda
