// Gated MLA (NoPE) mixer: expanded prefill (also the training forward that saves its
// activations) and absorbed decode (see mla_mixer.h). Backward: mla_mixer_backward.cpp.
#include "model/mla_mixer.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace k3 {

template <typename R>
void MLACacheT<R>::clear(Device* dev) {
  c_kv.place(dev);
  k_rope.place(dev);
  c_kv.clear();
  k_rope.clear();
  n = 0;
}

template <typename R>
void MLACacheT<R>::move_to(Device* dev) {
  c_kv.move_to(dev);
  k_rope.move_to(dev);
}

template <typename R>
void MLACacheT<R>::reserve(int64_t tokens, const MLADims& dims) {
  c_kv.reserve(size_t(tokens * dims.kv_lora));
  k_rope.reserve(size_t(tokens * dims.rope));
}

template <typename R>
void MLACacheT<R>::truncate(int64_t keep, const MLADims& dims) {
  K3_ASSERT(keep >= 0 && keep <= n, "MLACache::truncate: keeps more tokens than the cache holds");
  c_kv.resize(size_t(keep * dims.kv_lora));
  k_rope.resize(size_t(keep * dims.rope));
  n = keep;
}

template <typename R>
void MLASavedT<R>::ensure(int64_t Tn, const MLADims& dm) {
  T = Tn;
  const int64_t Dq = dm.nope + dm.rope, A = dm.kv_lora + dm.rope, HV = dm.H * dm.v;
  if (keep_input) grow(x, Tn * dm.d);
  grow(cq_raw, Tn * dm.q_lora);
  grow(cq_rstd, Tn);
  grow(cq, Tn * dm.q_lora);
  grow(q, Tn * dm.H * Dq);
  grow(kva, Tn * A);
  grow(ckv_rstd, Tn);
  grow(ckv, Tn * dm.kv_lora);
  grow(kv, Tn * dm.H * (dm.nope + dm.v));
  grow(o, Tn * HV);
  grow(lse, Tn * dm.H);
  if (dm.output_gate) grow(gate_lin, Tn * HV);
}

template <typename R>
static void check(const OpsT<R>& ops, const MLAWeightsT<R>& w, const MLADims& dm, const MLACacheT<R>& cache) {
  K3_ASSERT(dm.d > 0 && dm.H > 0 && dm.q_lora > 0 && dm.kv_lora > 0 && dm.nope > 0 && dm.rope >= 0 && dm.v > 0,
            "mla: bad dimensions");
  K3_ASSERT(w.q_a_proj.present() && w.q_a_norm && w.q_b_proj.present() && w.kv_a_proj.present() && w.kv_a_norm &&
                w.kv_b_proj.present() && w.o_proj.present() && (!dm.output_gate || w.g_proj.present()),
            "mla: missing weight");
  K3_ASSERT(int64_t(cache.c_kv.size()) == cache.n * dm.kv_lora && int64_t(cache.k_rope.size()) == cache.n * dm.rope,
            "mla: cache does not match its token count");
  K3_ASSERT(cache.c_kv.device() == ops.device() && cache.k_rope.device() == ops.device(),
            "mla: cache not on the backend's device");
}

// Pointers of one forward call's intermediates: the saved buffers in training, else scratch.
template <typename R>
struct MLAActs {
  R *cq_raw, *cq_rstd, *cq, *q, *kva, *ckv_rstd, *o, *lse, *gate;
};

// Queries q [T, H, nope + rope] = W_qb RMSNorm(W_qa x), and W_kva x into a.kva.
template <typename R>
static void project(const OpsT<R>& ops, const R* x, const MLAWeightsT<R>& w, const MLADims& dm, int64_t T,
                    const MLAActs<R>& a) {
  const int64_t Dq = dm.nope + dm.rope, A = dm.kv_lora + dm.rope;
  linear(ops, a.cq_raw, x, w.q_a_proj, T, dm.d, dm.q_lora);
  ops.rmsnorm(a.cq, dm.q_lora, a.cq_rstd, a.cq_raw, dm.q_lora, w.q_a_norm, T, dm.q_lora, dm.rms_eps);
  linear(ops, a.q, a.cq, w.q_b_proj, T, dm.q_lora, dm.H * Dq);
  linear(ops, a.kva, x, w.kv_a_proj, T, dm.d, A);
}

// The T new tokens' latents (rows kva [T, kv_lora + rope]) go into the cache:
// c_kv = RMSNorm(kva[:kv_lora]), k_rope = kva[kv_lora:] (never rotated).
template <typename R>
static void append(const OpsT<R>& ops, MLACacheT<R>& cache, const R* kva, const MLAWeightsT<R>& w, const MLADims& dm,
                   int64_t T, R* ckv_rstd, R* saved_ckv) {
  const int64_t A = dm.kv_lora + dm.rope, P = cache.n;
  cache.c_kv.resize(size_t((P + T) * dm.kv_lora));
  cache.k_rope.resize(size_t((P + T) * dm.rope));
  ops.rmsnorm(cache.c_kv.data() + P * dm.kv_lora, dm.kv_lora, ckv_rstd, kva, A, w.kv_a_norm, T, dm.kv_lora,
              dm.rms_eps);
  ops.copy_rows(cache.k_rope.data() + P * dm.rope, dm.rope, kva + dm.kv_lora, A, T, dm.rope);
  if (saved_ckv) std::memcpy(saved_ckv, cache.c_kv.data() + P * dm.kv_lora, sizeof(R) * size_t(T * dm.kv_lora));
  cache.n = P + T;
}

template <typename R>
static void project_and_append(const OpsT<R>& ops, MLACacheT<R>& cache, const R* x, const MLAWeightsT<R>& w,
                               const MLADims& dm, int64_t T, const MLAActs<R>& a, R* saved_ckv) {
  project<R>(ops, x, w, dm, T, a);
  append<R>(ops, cache, a.kva, w, dm, T, a.ckv_rstd, saved_ckv);
}

// out = W_o (o * sigmoid(W_g x)), o [T, H * v]. In place on o unless y is given (training
// keeps o and the gate logits).
template <typename R>
static void gate_and_project(const OpsT<R>& ops, R* out, const R* x, const MLAWeightsT<R>& w, const MLADims& dm,
                             int64_t T, R* o, R* gate, R* y) {
  const int64_t HV = dm.H * dm.v;
  R* src = o;
  if (dm.output_gate) {
    linear(ops, gate, x, w.g_proj, T, dm.d, HV);
    if (y) {
      ops.mul_sigmoid(y, o, gate, T * HV);
      src = y;
    } else {
      ops.mul_sigmoid(o, o, gate, T * HV);
    }
  }
  linear(ops, out, src, w.o_proj, T, HV, dm.d);
}

static double softmax_scale(const MLADims& dm) { return 1.0 / std::sqrt(double(dm.nope + dm.rope)); }

double mla_logn_factor(const MLADims& dm, int64_t p) {
  if (dm.logn_base <= 1 || p + 1 <= dm.logn_base) return 1.0;
  return std::log(double(p + 1)) / std::log(double(dm.logn_base));
}

// Queries q [T, H * Dq] of absolute positions P .. P + T - 1 scaled by mla_logn_factor: the
// whole row, so every score s_ij = scale q_i . k_j of query i is (the softmax temperature).
template <typename R>
static void apply_logn(const OpsT<R>& ops, R* q, const MLADims& dm, int64_t P, int64_t T) {
  if (dm.logn_base <= 1) return;
  const int64_t row = dm.H * (dm.nope + dm.rope);
  for (int64_t t = 0; t < T; ++t) {
    const double f = mla_logn_factor(dm, P + t);
    if (R(f) == R(1)) continue;
    ops.scale(q + t * row, f, row);
  }
}

AttentionDims mla_attention_dims(const MLADims& dm, int64_t T, int64_t P) {
  const int64_t KV = dm.nope + dm.v;
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
  return ad;
}

template <typename R>
void mla_mixer_forward(const OpsT<R>& ops, R* out, MLACacheT<R>& cache, const R* x, const MLAWeightsT<R>& w,
                       const MLADims& dm, int64_t T, MLAScratchT<R>& s, MLASavedT<R>* saved) {
  Device* dev = ops.device();
  check(ops, w, dm, cache);
  K3_ASSERT(!saved || !dev, "mla: a training forward (saved) is CPU-only");
  K3_ASSERT(!saved || cache.n == 0, "mla: a training forward (saved) must start from an empty cache");
  K3_ASSERT(!saved || dm.logn_base == 0, "mla: log-length attention scaling is an inference option, not trained");
  if (T == 0) {
    if (saved) saved->ensure(0, dm);
    return;
  }
  const int64_t P = cache.n, Dq = dm.nope + dm.rope, A = dm.kv_lora + dm.rope, HV = dm.H * dm.v;
  const int64_t Tk = P + T, KV = dm.nope + dm.v;
  MLAActs<R> a{};
  R* kv;
  if (saved) {
    saved->ensure(T, dm);
    if (saved->keep_input) std::memcpy(saved->x.data(), x, sizeof(R) * size_t(T * dm.d));
    a = {saved->cq_raw.data(), saved->cq_rstd.data(), saved->cq.data(), saved->q.data(), saved->kva.data(),
         saved->ckv_rstd.data(), saved->o.data(), saved->lse.data(), dm.output_gate ? saved->gate_lin.data() : nullptr};
    kv = saved->kv.data();
    grow(s.y, T * HV);
  } else {
    grow(s.cq_raw, T * dm.q_lora, dev);
    grow(s.cq, T * dm.q_lora, dev);
    grow(s.q, T * dm.H * Dq, dev);
    grow(s.kva, T * A, dev);
    grow(s.kv, Tk * dm.H * KV, dev);
    grow(s.o, T * HV, dev);
    if (dm.output_gate) grow(s.gate, T * HV, dev);
    a = {s.cq_raw.data(), nullptr, s.cq.data(), s.q.data(), s.kva.data(), nullptr, s.o.data(), nullptr,
         dm.output_gate ? s.gate.data() : nullptr};
    kv = s.kv.data();
  }
  project_and_append(ops, cache, x, w, dm, T, a, saved ? saved->ckv.data() : nullptr);
  apply_logn(ops, a.q, dm, P, T);
  // Expand every cached latent into per-head [k_nope | v]: kv [Tk, H, nope + v].
  linear(ops, kv, cache.c_kv.data(), w.kv_b_proj, Tk, dm.kv_lora, dm.H * KV);
  const AttentionDims ad = mla_attention_dims(dm, T, P);
  ops.attention(a.o, a.q, kv, cache.k_rope.data(), kv + dm.nope, ad, s.attn, a.lse);
  gate_and_project(ops, out, x, w, dm, T, a.o, a.gate, saved ? s.y.data() : nullptr);
}

template struct MLACacheT<float>;
template struct MLACacheT<double>;
template struct MLASavedT<float>;
template struct MLASavedT<double>;
template void mla_mixer_forward<float>(const OpsT<float>&, float*, MLACacheT<float>&, const float*,
                                       const MLAWeightsT<float>&, const MLADims&, int64_t, MLAScratchT<float>&,
                                       MLASavedT<float>*);
template void mla_mixer_forward<double>(const OpsT<double>&, double*, MLACacheT<double>&, const double*,
                                        const MLAWeightsT<double>&, const MLADims&, int64_t, MLAScratchT<double>&,
                                        MLASavedT<double>*);

void mla_mixer_decode_batch(const Ops& ops, float* out, MLACache* const* caches, const int64_t* seg, int64_t n_seg,
                            const float* x, const MLAWeights& w, const MLADims& dm, MLAScratch& s) {
  Device* dev = ops.device();
  K3_ASSERT(n_seg >= 1 && seg[0] == 0, "mla_mixer_decode_batch: segments do not start at row 0");
  const int64_t T = seg[n_seg];
  for (int64_t j = 0; j < n_seg; ++j) {
    check(ops, w, dm, *caches[j]);
    K3_ASSERT(seg[j + 1] >= seg[j], "mla_mixer_decode_batch: segments out of order");
  }
  if (T == 0) return;
  const int64_t Dq = dm.nope + dm.rope, KV = dm.nope + dm.v, L = dm.kv_lora, Da = L + dm.rope;
  grow(s.cq_raw, T * dm.q_lora, dev);
  grow(s.cq, T * dm.q_lora, dev);
  grow(s.q, T * dm.H * Dq, dev);
  grow(s.kva, T * Da, dev);
  if (dm.output_gate) grow(s.gate, T * dm.H * dm.v, dev);
  const MLAActs<float> a{s.cq_raw.data(), nullptr, s.cq.data(), s.q.data(), s.kva.data(),
                         nullptr,         nullptr, nullptr,     nullptr};
  // Projections over every row: each weight is read once for the batch.
  project<float>(ops, x, w, dm, T, a);
  for (int64_t j = 0; j < n_seg; ++j)
    apply_logn(ops, s.q.data() + seg[j] * dm.H * Dq, dm, caches[j]->n, seg[j + 1] - seg[j]);
  grow(s.qa, T * dm.H * Da, dev);
  grow(s.olat, T * dm.H * L, dev);
  grow(s.o, T * dm.H * dm.v, dev);
  // Absorbed query per head: [q_nope W_uk[h] | q_rope], W_uk[h] = kv_b rows [h*KV, h*KV + nope)
  // ([nope, kv_lora]), so q . k_nope = (W_uk^T q_nope) . c_kv.
  ops.gemm_batched(false, false, T, L, dm.nope, 1.f, s.q.data(), dm.H * Dq, Dq, w.kv_b_proj, L, KV * L, 0.f,
                   s.qa.data(), dm.H * Da, Da, dm.H);
  ops.copy_rows(s.qa.data() + L, Da, s.q.data() + dm.nope, Dq, T * dm.H, dm.rope);
  // Per sequence: its new latents join its cache, its queries attend over it. One shared kv
  // head: keys [c_kv | k_rope], values c_kv; o_lat [T, H, kv_lora].
  for (int64_t j = 0; j < n_seg; ++j) {
    const int64_t r = seg[j], Tj = seg[j + 1] - seg[j];
    if (Tj == 0) continue;
    MLACache& cache = *caches[j];
    const int64_t P = cache.n;
    append<float>(ops, cache, s.kva.data() + r * Da, w, dm, Tj, nullptr, nullptr);
    AttentionDims ad;
    ad.Tq = Tj;
    ad.P = P;
    ad.H = dm.H;
    ad.Hkv = 1;
    ad.Dk = L;
    ad.Dr = dm.rope;
    ad.Dv = L;
    ad.scale = softmax_scale(dm);
    ops.attention(s.olat.data() + r * dm.H * L, s.qa.data() + r * dm.H * Da, cache.c_kv.data(), cache.k_rope.data(),
                  cache.c_kv.data(), ad, s.attn, nullptr);
  }
  // Value half: o[h] = W_uv[h] o_lat[h], W_uv[h] = kv_b rows [h*KV + nope, (h+1)*KV) ([v, kv_lora]).
  ops.gemm_batched(false, true, T, dm.v, L, 1.f, s.olat.data(), dm.H * L, L, w.kv_b_proj.offset(dm.nope * L), L,
                   KV * L, 0.f, s.o.data(), dm.H * dm.v, dm.v, dm.H);
  gate_and_project<float>(ops, out, x, w, dm, T, s.o.data(), dm.output_gate ? s.gate.data() : nullptr, nullptr);
}

void mla_mixer_decode(const Ops& ops, float* out, MLACache& cache, const float* x, const MLAWeights& w,
                      const MLADims& dm, int64_t T, MLAScratch& s) {
  MLACache* c = &cache;
  const int64_t seg[2] = {0, T};
  mla_mixer_decode_batch(ops, out, &c, seg, 1, x, w, dm, s);
}

}  // namespace k3
