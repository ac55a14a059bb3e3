// The KDA mixer (docs/model.md section 3; fixtures ops/kda_layer1.json, kda_layer8.json): wiring
// only, the ops live in kernels/. One sequence, x [T, d] (already RMSNorm_in-ed) to out [T, d]:
//   q, k, v = ShortConv_SiLU(W_q x), ShortConv_SiLU(W_k x), ShortConv_SiLU(W_v x)  (conv state carried)
//   q, k    = L2Norm per head (eps 1e-6); q is scaled by D^-0.5 inside the recurrence
//   beta    = sigmoid(W_b x)                                        [T, H]
//   g       = gate(z = W_fb(W_fa x), A_log per head, dt_bias)       [T, H*D] log-decay
//   o       = KDA(q, k, v, g, beta; S)                              (S carried)
//   out     = W_o( RMSNorm_head(o) * o_norm * sigmoid(W_g x) )
// Weights are nn.Linear-shaped [out, in]. State carries across calls, so a prefill followed by
// one-token calls equals one call over all tokens.
// Templates on the scalar type R (float for inference and training, double for gradient
// checks); KDAWeights, KDAState, ... are the float instantiations. The backward
// (kda_mixer_backward, model/kda_mixer_backward.cpp) differentiates one forward call that
// saved its activations in a KDASavedT.
#pragma once
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "kernels/kda_fast.h"
#include "kernels/ops.h"
#include "kernels/weight_mat.h"

namespace k3 {

// Matrices as held (MatT: f32, or bf16 as a checkpoint stores them); vectors f32.
template <typename R>
struct KDAWeightsT {
  MatT<R> q_proj;    // [H*D, d]
  MatT<R> k_proj;    // [H*D, d]
  MatT<R> v_proj;    // [H*D, d]
  const R* q_conv;   // [H*D, 1, K] depthwise taps, oldest first
  const R* k_conv;   // [H*D, 1, K]
  const R* v_conv;   // [H*D, 1, K]
  MatT<R> f_a;       // [D, d]   low-rank gate, first factor
  MatT<R> f_b;       // [H*D, D] low-rank gate, second factor
  MatT<R> b_proj;    // [H, d]   beta logits
  MatT<R> g_proj;    // [H*D, d] output gate logits (full rank)
  const R* o_norm;   // [D]      per-head RMSNorm gain, shared by heads
  MatT<R> o_proj;    // [d, H*D]
  const R* A_log;    // [H]      one decay rate per head
  const R* dt_bias;  // [H*D]
};
using KDAWeights = KDAWeightsT<float>;

// Parameter gradients, one per KDAWeightsT field with the same shape; accumulated (+=).
template <typename R>
struct KDAGradsT {
  R* q_proj;   // [H*D, d]
  R* k_proj;   // [H*D, d]
  R* v_proj;   // [H*D, d]
  R* q_conv;   // [H*D, 1, K]
  R* k_conv;   // [H*D, 1, K]
  R* v_conv;   // [H*D, 1, K]
  R* f_a;      // [D, d]
  R* f_b;      // [H*D, D]
  R* b_proj;   // [H, d]
  R* g_proj;   // [H*D, d]
  R* o_norm;   // [D]
  R* o_proj;   // [d, H*D]
  R* A_log;    // [H]
  R* dt_bias;  // [H*D]
};
using KDAGrads = KDAGradsT<float>;

struct KDADims {
  int64_t d, H, D, conv_k;  // model width, heads, head dim (key = value), conv kernel
  bool bounded;             // K3's lower-bounded gate (true) or Kimi Linear's softplus gate
  double lower_bound;       // gate floor g_min (-5 for K3)
  double rms_eps;           // eps of the output RMSNorm (config rms_norm_eps)
};

constexpr double kKdaL2Eps = 1e-6;       // q, k L2Norm eps (docs/model.md section 3)
constexpr int64_t kKdaMixerChunk = 64;   // chunk of the chunked and fast cores
// The fast core's options as the mixer runs it: chunk 64, f32 products, the Dense diagonal
// tiles only for a bounded gate with floor >= -5 (else Safe).
KDAFastOptions kda_mixer_fast_options(const KDADims& dims, bool save_for_backward);

// Carried per-sequence state, on the host or on the backend's device. reset() zero-fills it
// for a fresh sequence on `dev` (null: the host).
template <typename R>
struct KDAStateT {
  Buf<R> S;                       // [H, D, D] recurrent state (key rows, value cols)
  Buf<R> conv_q, conv_k, conv_v;  // [H*D, K-1] last K-1 conv inputs, oldest first
  void reset(const KDADims& dims, Device* dev = nullptr);
  void move_to(Device* dev);  // keeps the contents
};
using KDAState = KDAStateT<float>;

// The state after each token but the last of a multi-token decode call (KDAPath::Steps), kept
// when `enabled`, so that the call can be cut back to a shorter prefix without computing it
// again (speculative decoding's rejected drafts, infer/session.h). `tokens` is the logged
// call's length, 0 when the last call given the log could not log (another path, a batch).
struct KDAStepLog {
  bool enabled = false;
  int64_t tokens = 0;
  std::vector<float> S;                       // [tokens - 1, H, D, D]: after tokens 1 .. tokens-1
  std::vector<float> conv_q, conv_k, conv_v;  // [tokens - 1, H*D, K-1]
  // state = the state after the logged call's first n tokens (1 <= n < tokens).
  void restore(KDAState& state, int64_t n) const;
};

enum class KDAPath {
  Recurrent,  // token-by-token reference recurrence (kda_recurrent_forward)
  Chunked,    // reference chunkwise form (kda_chunk_forward, chunk 64)
  Fast,       // float: kda_chunk_fast_forward (chunk 64, f32 products; with `saved` it keeps its
              // per-chunk states for the backward); double: runs the Chunked reference
  Steps,      // float: kda_decode_step_fast token by token (a few decode tokens in one call, the
              // same arithmetic as that many one-token steps); double: the Recurrent reference
};

// The activations one forward call saves for kda_mixer_backward (buffers grow, never shrink):
// one buffer per role (issue 32), and nothing the backward recomputes bit for bit from what is
// here at elementwise cost: the conv outputs (the conv again from q/k/v_lin and the saved conv
// states), q, k (their L2 norm with the same code) and v, and the log-decay g (the gate of z).
// With `saved` given, the forward writes these quantities here, the rest to the scratch. Sized
// for the call's T; the carried state is the one the call started from.
template <typename R>
struct KDASavedT {
  int64_t T = 0;                            // tokens of the saved call
  KDAPath path = KDAPath::Recurrent;        // core path the forward ran
  // keep_input false: the caller keeps the mixer input itself (the decoder layer recomputes
  // it, docs/architecture.md "Training memory") and hands it to the backward; x stays empty.
  bool keep_input = true;
  std::vector<R> x;                         // [T, d]      mixer input (keep_input)
  std::vector<R> S0;                        // [H, D, D]   KDA state before the call
  std::vector<R> conv_q0, conv_k0, conv_v0; // [H*D, K-1]  conv states before the call
  std::vector<R> q_lin, k_lin, v_lin;       // [T, H*D]    W x, the conv inputs
  std::vector<R> q_inv, k_inv;              // [T*H]       1 / sqrt(sum^2 + 1e-6)
  std::vector<R> beta;                      // [T, H]      sigmoid(W_b x)
  std::vector<R> fa;                        // [T, D]      W_fa x
  std::vector<R> z;                         // [T, H*D]    W_fb fa, gate input
  std::vector<R> o;                         // [T, H*D]    KDA core output
  std::vector<R> o_rstd;                    // [T*H]       output RMSNorm 1/rms
  std::vector<R> gate_lin;                  // [T, H*D]    W_g x, output gate logits
  // Fast core (float): the fast forward's per-chunk states, or (other paths) filled by the
  // backward's own state pass. The backward uses its scratch too, hence mutable.
  mutable KDAWorkspace ws;
  void ensure(int64_t T, const KDADims& dims);
};
using KDASaved = KDASavedT<float>;

// Reusable buffers, grown on first use and never shrunk, so repeated calls do not allocate.
// Without `saved`, the forward leaves the activations of the last call here under the names
// KDASavedT uses (so the forward's intermediates can be inspected); the backward's
// intermediates are the d* buffers.
template <typename R>
struct KDAScratchT {
  Buf<R> q_lin, k_lin, v_lin;  // [T, H*D] W x, conv inputs
  Buf<R> q_pre, k_pre, v_pre;  // [T, H*D] pre-SiLU conv outputs
  Buf<R> q_act, k_act;         // [T, H*D] SiLU outputs, L2Norm inputs
  Buf<R> v;                    // [T, H*D] SiLU(v_pre), recurrence v
  Buf<R> q, k;                 // [T, H*D] L2-normalised
  Buf<R> q_inv, k_inv;         // [T*H]    1 / sqrt(sum^2 + 1e-6)
  Buf<R> beta;                 // [T, H]   sigmoid(W_b x)
  Buf<R> fa;                   // [T, D]   W_fa x
  Buf<R> z;                    // [T, H*D] W_fb fa, gate input
  Buf<R> g;                    // [T, H*D] log-decay
  Buf<R> o;                    // [T, H*D] KDA core output
  Buf<R> o_rstd;               // [T*H]    output RMSNorm 1/rms
  Buf<R> o_normed;             // [T, H*D] RMSNorm(o) * o_norm
  Buf<R> gate_lin;             // [T, H*D] W_g x
  Buf<R> y;                    // [T, H*D] o_normed * sigmoid(gate), W_o input
  // backward
  Buf<R> dy;                   // [T, H*D] d out / d y, then d o_normed
  Buf<R> dgate;                // [T, H*D] d gate_lin
  Buf<R> d_o;                  // [T, H*D] d o
  Buf<R> dq, dk, dv, dg;       // [T, H*D] core input gradients (dg then dz)
  Buf<R> dbeta;                // [T, H]   d beta, then d beta logits
  Buf<R> dfa;                  // [T, D]
  Buf<R> dact;                 // [T, H*D] d q_act / d k_act
  Buf<R> dlin;                 // [T, H*D] d q_lin / d k_lin / d v_lin
  Buf<R> conv0;                        // [H*D, K-1] backward: a saved conv state, run again
  KDAWorkspace ws;                     // fast core (float) without `saved`
  void ensure(int64_t T, const KDADims& dims, Device* dev = nullptr);  // forward buffers on dev
  void ensure_backward(int64_t T, const KDADims& dims);
};
using KDAScratch = KDAScratchT<float>;

// out [T, d] = KDA(x [T, d]); state carried in/out. Without `saved`, T == 1 uses the decode
// step (kda_decode_step; kda_decode_step_fast on the Fast path; the recurrence in double)
// whatever the path. With `saved` (training), the call's activations and starting state are
// stored there for kda_mixer_backward, and T == 1 runs the path's own core. With `log`
// (float, no `saved`), a Steps call or a one-token call logs its per-token states there.
// ops: the backend (kernels/ops.h); every pointer and the state on its device. A training
// forward (saved) and the step log run on the CPU backend only.
template <typename R>
void kda_mixer_forward(const OpsT<R>& ops, R* out, KDAStateT<R>& state, const R* x, const KDAWeightsT<R>& w,
                       const KDADims& dims, int64_t T, KDAPath path, KDAScratchT<R>& scratch,
                       KDASavedT<R>* saved = nullptr, KDAStepLog* log = nullptr);
template <typename R>
void kda_mixer_forward(R* out, KDAStateT<R>& state, const R* x, const KDAWeightsT<R>& w, const KDADims& dims,
                       int64_t T, KDAPath path, KDAScratchT<R>& scratch, KDASavedT<R>* saved = nullptr,
                       KDAStepLog* log = nullptr) {
  kda_mixer_forward<R>(cpu_ops<R>(), out, state, x, w, dims, T, path, scratch, saved, log);
}

// Several sequences in one call (batched decode): rows [seg[j], seg[j+1]) of x [seg[n_seg], d]
// belong to the sequence whose state is *states[j] (seg[0] = 0). Projections, norms and gates
// run over all rows at once, so each weight is read once for the batch; the short conv and the
// recurrence run per sequence (a one-row segment takes the decode step). Each sequence's rows
// equal a kda_mixer_forward call on that sequence alone (tests/model/test_forward_batch.cpp).
void kda_mixer_forward_batch(const Ops& ops, float* out, KDAState* const* states, const int64_t* seg, int64_t n_seg,
                             const float* x, const KDAWeights& w, const KDADims& dims, KDAPath path,
                             KDAScratch& scratch);

// Backward of the forward call that filled `saved` (same weights and dims; T == saved.T).
// dx [T, d] is assigned; grads are accumulated (+=); dout [T, d] is the gradient of out.
// Gradients w.r.t. the starting KDA and conv states are not formed (training starts each
// sequence from zero state). Core backward: double uses the recurrent reference
// (kda_recurrent_backward); float uses kda_chunk_fast_backward (chunk 64, f32).
// x: the forward's input [T, d] when saved.keep_input was false (else null: saved.x).
template <typename R>
void kda_mixer_backward(R* dx, const KDAGradsT<R>& grads, const R* dout, const KDASavedT<R>& saved,
                        const KDAWeightsT<R>& w, const KDADims& dims, int64_t T, KDAScratchT<R>& scratch,
                        const R* x = nullptr);

}  // namespace k3
