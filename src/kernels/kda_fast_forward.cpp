// Fast chunked KDA forward and the vectorised decode step (contract in kda_fast.h;
// docs/model.md section 3). Each OpenMP thread takes a contiguous group of heads and runs them
// chunk-major; per chunk everything lives in the thread's scratch (about 1 MB), so the memory
// traffic is the inputs, o, and (when training) the saved per-chunk quantities.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/kda_fast_impl.h"


namespace k3 {
namespace kda_fast {

namespace {

// Chunk c of head h; S [Dkp, Dvp] is the head's state, updated in place.
void forward_chunk(const Geom& gm, Scratch& s, KDAWorkspace::Impl& ws, float* o, float* S, const float* q,
                   const float* k, const float* v, const float* g, const float* beta, int64_t h, int64_t c,
                   bool save) {
  const int64_t C = gm.C, Kp = gm.Dkp, Vp = gm.Dvp, Dv = gm.Dv, H = gm.H;
  const bool bf = gm.bf16;
  const int64_t t0 = c * C, n = std::min(C, gm.Tn - t0);
  prep_chunk(gm, s, q, k, v, g, beta, h, t0, n, /*prefetch_v=*/true, /*keep_factors=*/false);
  if (save) std::memcpy(ws.state_at(h, c), S, size_t(Kp * Vp) * 4);
  intra_chunk(gm, s);
  ut_transform(gm, s, s.Akk);
  if (save) {
    std::memcpy(ws.akk_at(h, c), s.Akk, size_t(C * C) * 4);
    std::memcpy(ws.aqk_at(h, c), s.Aqk, size_t(C * C) * 4);
  }
  // P = [K E ; Q E] S: the state read by the keys (for R) and by the queries (for O).
  mm(s.P, Vp, a_op(bf, s.KQe, Kp, false, 2 * C, Kp, s.ha), b_op(bf, S, Vp, false, Kp, Vp, s.hb1), 2 * C, Vp, Kp,
     1.f, false);
  // R = V - K E S;  V' = Tm R. V is read from v in place (prep_chunk prefetched its rows):
  // a copy into the scratch cost 4 % of the forward. Padding rows and columns have V = 0.
  float* R = save ? ws.r_at(h, c) : s.R;
  float* Vq = save ? ws.vp_at(h, c) : s.Vp;
  for (int64_t i = 0; i < C; ++i) {
    const float* P = s.P + i * Vp;
    float* Ri = R + i * Vp;
    const int64_t nv = i < n ? Dv : 0;
    if (nv) {
      const float* vi = v + ((t0 + i) * H + h) * Dv;
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) Ri[j] = vi[j] - P[j];
    }
    for (int64_t j = nv; j < Vp; ++j) Ri[j] = 0.f - P[j];
  }
  mm(Vq, Vp, a_op(bf, s.Tm, C, false, C, C, s.ha), b_op(bf, R, Vp, false, C, Vp, s.hb2), C, Vp, C, 1.f, false,
     Tri::Lower);
  // O = Q E S + Aqk V'
  const BOp bv = b_op(bf, Vq, Vp, false, C, Vp, s.hb1);
  float* O = s.P + C * Vp;
  mm(O, Vp, a_op(bf, s.Aqk, C, false, C, C, s.ha), bv, C, Vp, C, 1.f, true, Tri::Lower);
  // S = diag(El) S + Kd^T V'
  for (int64_t d = 0; d < Kp; ++d) {
    const float e = s.El[d];
#pragma omp simd
    for (int64_t j = 0; j < Vp; ++j) S[d * Vp + j] *= e;
  }
  mm(S, Vp, a_op(bf, s.Kd, Kp, true, Kp, C, s.ha), bv, Kp, Vp, C, 1.f, true);
  if (o)
    for (int64_t i = 0; i < n; ++i) store_row(o + ((t0 + i) * H + h) * Dv, O + i * Vp, Dv, 1.f, gm.stream);
}

}  // namespace

void forward_heads(const Geom& gm, Scratch& s, KDAWorkspace::Impl& ws, float* o, const float* state_in,
                   float* state_out, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int64_t h0, int64_t h1, bool save) {
  const int64_t KV = gm.Dkp * gm.Dvp, Dk = gm.Dk, Dv = gm.Dv, Vp = gm.Dvp;
  s.heads.reserve(size_t(2 * (h1 - h0) * KV) * 4);
  float* St = s.heads.as<float>();
  for (int64_t h = h0; h < h1; ++h) {
    float* S = St + (h - h0) * KV;
    std::memset(S, 0, size_t(KV) * 4);
    if (state_in)
      for (int64_t d = 0; d < Dk; ++d) std::memcpy(S + d * Vp, state_in + (h * Dk + d) * Dv, size_t(Dv) * 4);
  }
  for (int64_t c = 0; c < gm.NT; ++c)
    for (int64_t h = h0; h < h1; ++h) forward_chunk(gm, s, ws, o, St + (h - h0) * KV, q, k, v, g, beta, h, c, save);
  if (state_out)
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t d = 0; d < Dk; ++d)
        std::memcpy(state_out + (h * Dk + d) * Dv, St + (h - h0) * KV + d * Vp, size_t(Dv) * 4);
}

}  // namespace kda_fast

void kda_chunk_fast_forward(float* o, float* state, const float* q, const float* k, const float* v, const float* g,
                            const float* beta, int64_t Tn, int64_t H, int64_t Dk, int64_t Dv, double scale,
                            const KDAFastOptions& opt, KDAWorkspace& ws) {
  using namespace kda_fast;
  const Geom gm = make_geom(Tn, H, Dk, Dv, scale, opt);
  auto& W = ws.impl();
  W.saved = false;
  if (Tn == 0) return;
  W.prepare_threads(gm);
  if (opt.save_for_backward) W.prepare_saved(gm);
#pragma omp parallel
  {
    FlushDenormals ftz;
    int64_t h0, h1;
    head_range(H, omp_get_thread_num(), omp_get_num_threads(), &h0, &h1);
    forward_heads(gm, W.threads[omp_get_thread_num()], W, o, state, state, q, k, v, g, beta, h0, h1,
                  opt.save_for_backward);
    store_fence();
  }
  W.saved = opt.save_for_backward;
}

// ---------------------------------------------------------------------------------------
// decode step

namespace {

constexpr int64_t kDecodeMax = 1024;

void decode_head(float* o, float* S, const float* q, const float* k, const float* v, const float* g, float b,
                 int64_t Dk, int64_t Dv, float sc) {
  float a[kDecodeMax];
  kda_fast::vexp(a, g, Dk);
  float qk = 0;
  for (int64_t d = 0; d < Dk; ++d) qk += q[d] * k[d];
  kda_fast::decode_head_update(o, S, q, k, v, a, b, qk, sc, Dk, Dv);
}

}  // namespace

void kda_decode_step_fast(float* o, float* state, const float* q, const float* k, const float* v, const float* g,
                          const float* beta, int64_t H, int64_t Dk, int64_t Dv, double scale) {
  K3_ASSERT(Dk <= kDecodeMax && Dv <= kDecodeMax, "kda_decode_step_fast: Dk, Dv must be <= 1024");
  const float sc = float(scale);
  // Threads only when there is enough state to amortise the fork (64 KB per head at D = 128).
#pragma omp parallel for schedule(static) if (H * Dk * Dv >= (1 << 17))
  for (int64_t h = 0; h < H; ++h) {
    kda_fast::FlushDenormals ftz;
    decode_head(o + h * Dv, state + h * Dk * Dv, q + h * Dk, k + h * Dk, v + h * Dv, g + h * Dk, beta[h], Dk, Dv, sc);
  }
}

}  // namespace k3
