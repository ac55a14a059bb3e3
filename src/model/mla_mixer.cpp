// Gated MLA (NoPE) mixer: expanded prefill and absorbed decode (see mla_mixer.h).
#include "model/mla_mixer.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace k3 {

void MLACache::clear() {
  c_kv.clear();
  k_rope.clear();
  n = 0;
}

void MLACache::reserve(int64_t tokens, const MLADims& dims) {
  c_kv.reserve(size_t(tokens * dims.kv_lora));
  k_rope.reserve(size_t(tokens * dims.rope));
}

static void grow(std::vector<float>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
}

static void check(const MLAWeights& w, const MLADims& dm, const MLACache& cache) {
  K3_ASSERT(dm.d > 0 && dm.H > 0 && dm.q_lora > 0 && dm.kv_lora > 0 && dm.nope > 0 && dm.rope >= 0 && dm.v > 0,
            "mla: bad dimensions");
  K3_ASSERT(w.q_a_proj && w.q_a_norm && w.q_b_proj && w.kv_a_proj && w.kv_a_norm && w.kv_b_proj && w.o_proj &&
                (!dm.output_gate || w.g_proj),
            "mla: missing weight");
  K3_ASSERT(int64_t(cache.c_kv.size()) == cache.n * dm.kv_lora && int64_t(cache.k_rope.size()) == cache.n * dm.rope,
            "mla: cache does not match its token count");
}

// Queries q [T, H, nope + rope] = W_qb RMSNorm(W_qa x); then the new tokens' latents go into
// the cache: c_kv = RMSNorm(W_kva x [:kv_lora]), k_rope = (W_kva x)[kv_lora:] (never rotated).
static void project_and_append(MLACache& cache, const float* x, const MLAWeights& w, const MLADims& dm, int64_t T,
                               MLAScratch& s) {
  const int64_t Dq = dm.nope + dm.rope, A = dm.kv_lora + dm.rope;
  grow(s.cq_raw, T * dm.q_lora);
  grow(s.cq, T * dm.q_lora);
  grow(s.q, T * dm.H * Dq);
  grow(s.kva, T * A);
  linear(s.cq_raw.data(), x, w.q_a_proj, T, dm.d, dm.q_lora);
  rmsnorm_forward<float>(s.cq.data(), nullptr, s.cq_raw.data(), w.q_a_norm, T, dm.q_lora, dm.rms_eps);
  linear(s.q.data(), s.cq.data(), w.q_b_proj, T, dm.q_lora, dm.H * Dq);
  linear(s.kva.data(), x, w.kv_a_proj, T, dm.d, A);
  const int64_t P = cache.n;
  cache.c_kv.resize(size_t((P + T) * dm.kv_lora));
  cache.k_rope.resize(size_t((P + T) * dm.rope));
  for (int64_t t = 0; t < T; ++t) {
    rmsnorm_forward<float>(cache.c_kv.data() + (P + t) * dm.kv_lora, nullptr, s.kva.data() + t * A, w.kv_a_norm, 1,
                           dm.kv_lora, dm.rms_eps);
    std::memcpy(cache.k_rope.data() + (P + t) * dm.rope, s.kva.data() + t * A + dm.kv_lora,
                sizeof(float) * size_t(dm.rope));
  }
  cache.n = P + T;
}

// out = W_o (o * sigmoid(W_g x)), o = s.o [T, H * v].
static void gate_and_project(float* out, const float* x, const MLAWeights& w, const MLADims& dm, int64_t T,
                             MLAScratch& s) {
  const int64_t HV = dm.H * dm.v;
  if (dm.output_gate) {
    grow(s.gate, T * HV);
    linear(s.gate.data(), x, w.g_proj, T, dm.d, HV);
    for (int64_t i = 0; i < T * HV; ++i) s.o[i] *= sigmoid(s.gate[i]);
  }
  linear(out, s.o.data(), w.o_proj, T, HV, dm.d);
}

static double softmax_scale(const MLADims& dm) { return 1.0 / std::sqrt(double(dm.nope + dm.rope)); }

void mla_mixer_forward(float* out, MLACache& cache, const float* x, const MLAWeights& w, const MLADims& dm,
                       int64_t T, MLAScratch& s) {
  check(w, dm, cache);
  if (T == 0) return;
  const int64_t P = cache.n;
  project_and_append(cache, x, w, dm, T, s);
  const int64_t Tk = P + T, KV = dm.nope + dm.v;
  // Expand every cached latent into per-head [k_nope | v]: kv [Tk, H, nope + v].
  grow(s.kv, Tk * dm.H * KV);
  grow(s.o, T * dm.H * dm.v);
  linear(s.kv.data(), cache.c_kv.data(), w.kv_b_proj, Tk, dm.kv_lora, dm.H * KV);
  AttentionDims ad;
  ad.Tq = T;
  ad.P = P;
  ad.H = ad.Hkv = dm.H;
  ad.Dk = dm.nope;
  ad.Dr = dm.rope;
  ad.Dv = dm.v;
  ad.scale = softmax_scale(dm);
  ad.k_tok = ad.v_tok = dm.H * KV;
  ad.k_head = ad.v_head = KV;
  attention_forward(s.o.data(), s.q.data(), s.kv.data(), cache.k_rope.data(), s.kv.data() + dm.nope, ad, s.attn);
  gate_and_project(out, x, w, dm, T, s);
}

void mla_mixer_decode(float* out, MLACache& cache, const float* x, const MLAWeights& w, const MLADims& dm,
                      int64_t T, MLAScratch& s) {
  check(w, dm, cache);
  if (T == 0) return;
  const int64_t P = cache.n;
  project_and_append(cache, x, w, dm, T, s);
  const int64_t Dq = dm.nope + dm.rope, KV = dm.nope + dm.v, L = dm.kv_lora, Da = L + dm.rope;
  grow(s.qa, T * dm.H * Da);
  grow(s.olat, T * dm.H * L);
  grow(s.o, T * dm.H * dm.v);
  // Absorbed query per head: [q_nope W_uk[h] | q_rope], W_uk[h] = kv_b rows [h*KV, h*KV + nope)
  // ([nope, kv_lora]), so q . k_nope = (W_uk^T q_nope) . c_kv.
#pragma omp parallel for schedule(static) if (dm.H > 1)
  for (int64_t h = 0; h < dm.H; ++h) {
    gemm(false, false, T, L, dm.nope, 1.f, s.q.data() + h * Dq, dm.H * Dq, w.kv_b_proj + h * KV * L, L, 0.f,
         s.qa.data() + h * Da, dm.H * Da);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(s.qa.data() + (t * dm.H + h) * Da + L, s.q.data() + (t * dm.H + h) * Dq + dm.nope,
                  sizeof(float) * size_t(dm.rope));
  }
  // One shared kv head: keys [c_kv | k_rope], values c_kv; o_lat [T, H, kv_lora].
  AttentionDims ad;
  ad.Tq = T;
  ad.P = P;
  ad.H = dm.H;
  ad.Hkv = 1;
  ad.Dk = L;
  ad.Dr = dm.rope;
  ad.Dv = L;
  ad.scale = softmax_scale(dm);
  attention_forward(s.olat.data(), s.qa.data(), cache.c_kv.data(), cache.k_rope.data(), cache.c_kv.data(), ad,
                    s.attn);
  // Value half: o[h] = W_uv[h] o_lat[h], W_uv[h] = kv_b rows [h*KV + nope, (h+1)*KV) ([v, kv_lora]).
#pragma omp parallel for schedule(static) if (dm.H > 1)
  for (int64_t h = 0; h < dm.H; ++h)
    gemm(false, true, T, dm.v, L, 1.f, s.olat.data() + h * L, dm.H * L, w.kv_b_proj + (h * KV + dm.nope) * L, L, 0.f,
         s.o.data() + h * dm.v, dm.H * dm.v);
  gate_and_project(out, x, w, dm, T, s);
}

}  // namespace k3
