// Gated MLA mixer, NoPE (docs/model.md section 4; fixture ops/mla.json). For x [T, d] (the
// layer's RMS-normed input):
//   c_q = RMSNorm(W_qa x);  q = W_qb c_q, per head [q_nope | q_rope]
//   [c_kv | k_rope] = W_kva x;  c_kv = RMSNorm(c_kv)            (cached per token)
//   W_kvb c_kv per head = [k_nope | v];  head key [k_nope | k_rope] (k_rope shared by all heads)
//   o = causal softmax attention, scale (nope + rope)^-0.5, no rotation anywhere (NoPE)
//   out = W_o (o * sigmoid(W_g x))      (the gate only if output_gate)
// The cache holds the normed c_kv (what the fixture calls kv_latent) and the raw k_rope.
// Backward (training, model/mla_mixer_backward.cpp): reverse mode through one full-sequence
// forward from the activations in MLASavedT.
#pragma once
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "kernels/weight_mat.h"

namespace k3 {

// Templates on the scalar type R (float for inference and training, double for gradient
// checks); MLAWeights, MLACache, MLAScratch, ... are the float instantiations. The absorbed
// decode is float only (inference).
// Matrices as held (MatT: f32, or bf16 as a checkpoint stores them); norm gains f32.
template <typename R>
struct MLAWeightsT {
  MatT<R> q_a_proj;        // [q_lora, d]
  const R* q_a_norm;       // [q_lora]
  MatT<R> q_b_proj;        // [H * (nope + rope), q_lora]
  MatT<R> kv_a_proj;       // [kv_lora + rope, d]   kv_a_proj_with_mqa
  const R* kv_a_norm;      // [kv_lora]
  MatT<R> kv_b_proj;       // [H * (nope + v), kv_lora]
  MatT<R> o_proj;          // [d, H * v]
  MatT<R> g_proj;          // [H * v, d]            (used if output_gate)
};
using MLAWeights = MLAWeightsT<float>;

// Parameter gradients, one per MLAWeightsT field with the same shape; accumulated (+=).
// g_proj may be null when output_gate is false.
template <typename R>
struct MLAGradsT {
  R *q_a_proj,  // [q_lora, d]
      *q_a_norm,  // [q_lora]
      *q_b_proj,  // [H * (nope + rope), q_lora]
      *kv_a_proj,  // [kv_lora + rope, d]
      *kv_a_norm,  // [kv_lora]
      *kv_b_proj,  // [H * (nope + v), kv_lora]
      *o_proj,     // [d, H * v]
      *g_proj;     // [H * v, d]
};
using MLAGrads = MLAGradsT<float>;

struct MLADims {
  int64_t d, H, q_lora, kv_lora, nope, rope, v;
  bool output_gate;
  double rms_eps;
  // Log-length attention scaling at inference (0: off, the K3 forward). With a base N > 1 the
  // query at absolute position p (0-based) is multiplied by ln(p + 1) / ln(N) once p + 1 > N,
  // which keeps the attention's entropy from growing past the length N the model was trained
  // at (Qwen's logn attention; Nakanishi 2025, Scalable-Softmax). Not part of K3: an
  // extrapolation option of `eval`, refused by the training forward.
  int64_t logn_base = 0;
};
// The query scale at absolute position p under dm.logn_base (1 when off or within the base).
double mla_logn_factor(const MLADims& dm, int64_t p);

// Latent cache: one row per past token (docs/model.md section 4: 512 + 64 floats per token).
template <typename R>
struct MLACacheT {
  Buf<R> c_kv;    // [n, kv_lora] normed (host or the backend's device)
  Buf<R> k_rope;  // [n, rope]
  int64_t n = 0;
  void clear(Device* dev = nullptr);  // n = 0 on `dev` (null: the host), keeps capacity there
  void move_to(Device* dev);         // keeps the contents
  void reserve(int64_t tokens, const MLADims& dims);
  // Drops every token from position n on (n <= this->n): the cache is append-only, so this
  // rewinds it exactly (speculative decoding's rejected drafts, infer/speculative.h).
  void truncate(int64_t n, const MLADims& dims);
};
using MLACache = MLACacheT<float>;

// Activations one training forward saves for mla_mixer_backward (buffers grow, never shrink).
// Training runs whole sequences: the forward that fills this must start from an empty cache.
template <typename R>
struct MLASavedT {
  int64_t T = 0;             // tokens of the saved call
  bool keep_input = true;    // false: the caller keeps the input and hands it to the backward
  std::vector<R> x;          // [T, d]            mixer input (keep_input)
  std::vector<R> cq_raw;     // [T, q_lora]       W_qa x
  std::vector<R> cq_rstd;    // [T]               1 / rms of cq_raw
  std::vector<R> cq;         // [T, q_lora]       RMSNorm(cq_raw) * q_a_norm
  std::vector<R> q;          // [T, H, nope+rope] W_qb cq
  std::vector<R> kva;        // [T, kv_lora+rope] W_kva x  (the k_rope slice is kva[:, kv_lora:])
  std::vector<R> ckv_rstd;   // [T]               1 / rms of kva[:, :kv_lora]
  std::vector<R> ckv;        // [T, kv_lora]      normed c_kv
  std::vector<R> kv;         // [T, H, nope+v]    W_kvb c_kv = [k_nope | v] per head
  std::vector<R> o;          // [T, H*v]          attention output (before the gate)
  std::vector<R> lse;        // [T, H]            attention log-sum-exp
  std::vector<R> gate_lin;   // [T, H*v]          W_g x (if output_gate)
  void ensure(int64_t T, const MLADims& dims);
};
using MLASaved = MLASavedT<float>;

// Reusable buffers (grow only). The d* buffers are the backward's.
template <typename R>
struct MLAScratchT {
  Buf<R> cq_raw, cq, q, kva, kv, qa, olat, o, gate;  // forward (on the backend's device)
  std::vector<R> y, dy, dgate, d_o, dq, dkv, dkr, dckv, dkva, dcq, dcq_raw;
  AttentionScratch attn;  // float blocked attention
};
using MLAScratch = MLAScratchT<float>;

// The expanded forward's attention geometry: T queries after P cached tokens over per-head
// [k_nope | v] rows of kv [P + T, H, nope + v] (k at offset 0, v at offset nope) and the
// shared k_rope [P + T, rope]; scale (nope + rope)^-0.5.
AttentionDims mla_attention_dims(const MLADims& dims, int64_t T, int64_t P);

// Prefill / chunk: appends the T new tokens' latents to the cache and attends over the cache
// plus the new tokens (causal). K and V are re-expanded from the whole latent cache with
// W_kvb on every call. out [T, d]; x [T, d]. Float runs the blocked attention, double the
// plain reference. With `saved` (training; the cache must be empty) the activations are
// kept there for mla_mixer_backward.
// ops: the backend (kernels/ops.h); the cache on its device. Training (saved) is CPU-only.
template <typename R>
void mla_mixer_forward(const OpsT<R>& ops, R* out, MLACacheT<R>& cache, const R* x, const MLAWeightsT<R>& w,
                       const MLADims& dims, int64_t T, MLAScratchT<R>& scratch, MLASavedT<R>* saved = nullptr);
template <typename R>
void mla_mixer_forward(R* out, MLACacheT<R>& cache, const R* x, const MLAWeightsT<R>& w, const MLADims& dims,
                       int64_t T, MLAScratchT<R>& scratch, MLASavedT<R>* saved = nullptr) {
  mla_mixer_forward<R>(cpu_ops<R>(), out, cache, x, w, dims, T, scratch, saved);
}

// Backward of the forward call that filled `saved` (same weights and dims; T == saved.T):
// dx [T, d] assigned; every weight gradient accumulated (+=); dout [T, d]. Attention
// backward: float the blocked recompute-from-lse path, double the plain reference.
// x: the forward's input [T, d] when saved.keep_input was false (else null: saved.x).
template <typename R>
void mla_mixer_backward(R* dx, const MLAGradsT<R>& grads, const R* dout, const MLASavedT<R>& saved,
                        const MLAWeightsT<R>& w, const MLADims& dims, int64_t T, MLAScratchT<R>& scratch,
                        const R* x = nullptr);

// Decode (T = 1 or a few tokens) with absorbed projections: W_kvb's key half is folded into
// the query (q_nope W_uk gives a kv_lora-wide query) and its value half into the output, so
// all heads attend directly over the latent cache (one shared kv head: keys [c_kv | k_rope],
// values c_kv). Equals mla_mixer_forward up to float rounding.
void mla_mixer_decode(const Ops& ops, float* out, MLACache& cache, const float* x, const MLAWeights& w,
                      const MLADims& dims, int64_t T, MLAScratch& scratch);
inline void mla_mixer_decode(float* out, MLACache& cache, const float* x, const MLAWeights& w, const MLADims& dims,
                             int64_t T, MLAScratch& scratch) {
  mla_mixer_decode(cpu_ops<float>(), out, cache, x, w, dims, T, scratch);
}

// Several sequences in one call (batched decode): rows [seg[j], seg[j+1]) of x [seg[n_seg], d]
// belong to the sequence whose latent cache is *caches[j] (seg[0] = 0). Projections run over
// all rows (each weight read once for the batch); the cache append and the attention per
// sequence. Each sequence's rows equal mla_mixer_decode on that sequence alone.
void mla_mixer_decode_batch(const Ops& ops, float* out, MLACache* const* caches, const int64_t* seg, int64_t n_seg,
                            const float* x, const MLAWeights& w, const MLADims& dims, MLAScratch& scratch);

}  // namespace k3
