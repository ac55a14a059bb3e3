// The KDA mixer (K3_REFERENCE section 3; fixtures ops/kda_layer1.json, kda_layer8.json): wiring
// only, the ops live in kernels/. One sequence, x [T, d] (already RMSNorm_in-ed) to out [T, d]:
//   q, k, v = ShortConv_SiLU(W_q x), ShortConv_SiLU(W_k x), ShortConv_SiLU(W_v x)  (conv state carried)
//   q, k    = L2Norm per head (eps 1e-6); q is scaled by D^-0.5 inside the recurrence
//   beta    = sigmoid(W_b x)                                        [T, H]
//   g       = gate(z = W_fb(W_fa x), A_log per head, dt_bias)       [T, H*D] log-decay
//   o       = KDA(q, k, v, g, beta; S)                              (S carried)
//   out     = W_o( RMSNorm_head(o) * o_norm * sigmoid(W_g x) )
// Weights are nn.Linear-shaped [out, in] f32. State carries across calls, so a prefill
// followed by one-token calls equals one call over all tokens.
#pragma once
#include <cstdint>
#include <vector>

namespace k3 {

struct KDAWeights {
  const float* q_proj;   // [H*D, d]
  const float* k_proj;   // [H*D, d]
  const float* v_proj;   // [H*D, d]
  const float* q_conv;   // [H*D, 1, K] depthwise taps, oldest first
  const float* k_conv;   // [H*D, 1, K]
  const float* v_conv;   // [H*D, 1, K]
  const float* f_a;      // [D, d]   low-rank gate, first factor
  const float* f_b;      // [H*D, D] low-rank gate, second factor
  const float* b_proj;   // [H, d]   beta logits
  const float* g_proj;   // [H*D, d] output gate logits (full rank)
  const float* o_norm;   // [D]      per-head RMSNorm gain, shared by heads
  const float* o_proj;   // [d, H*D]
  const float* A_log;    // [H]      one decay rate per head
  const float* dt_bias;  // [H*D]
};

struct KDADims {
  int64_t d, H, D, conv_k;  // model width, heads, head dim (key = value), conv kernel
  bool bounded;             // K3's lower-bounded gate (true) or Kimi Linear's softplus gate
  double lower_bound;       // gate floor g_min (-5 for K3)
  double rms_eps;           // eps of the output RMSNorm (config rms_norm_eps)
};

// Carried per-sequence state. reset() zero-fills it for a fresh sequence.
struct KDAState {
  std::vector<float> S;                     // [H, D, D] recurrent state (key rows, value cols)
  std::vector<float> conv_q, conv_k, conv_v;  // [H*D, K-1] last K-1 conv inputs, oldest first
  void reset(const KDADims& dims);
};

enum class KDAPath {
  Recurrent,  // token-by-token reference recurrence (kda_recurrent_forward)
  Chunked,    // chunkwise form (kda_chunk_forward, chunk 64)
};

// Reusable buffers, grown on first use and never shrunk, so repeated calls do not allocate.
// They hold the activations of the last call under the names a backward would use; those
// marked "saved" are what the backward needs (besides x, the weights, and the carried state
// as it was BEFORE the call: S0 and the three conv states, which the caller must keep).
struct KDAScratch {
  std::vector<float> q_lin, k_lin, v_lin;  // [T, H*D] W x, conv inputs            (saved)
  std::vector<float> q_pre, k_pre, v_pre;  // [T, H*D] pre-SiLU conv outputs       (saved)
  std::vector<float> q_act, k_act;         // [T, H*D] SiLU outputs, L2Norm inputs  (recomputable from *_pre)
  std::vector<float> v;                    // [T, H*D] SiLU(v_pre), recurrence v    (saved)
  std::vector<float> q, k;                 // [T, H*D] L2-normalised                (saved)
  std::vector<float> q_inv, k_inv;         // [T*H]    1 / sqrt(sum^2 + 1e-6)        (saved)
  std::vector<float> beta;                 // [T, H]   sigmoid(W_b x)               (saved)
  std::vector<float> fa;                   // [T, D]   W_fa x                       (saved)
  std::vector<float> z;                    // [T, H*D] W_fb fa, gate input          (saved)
  std::vector<float> g;                    // [T, H*D] log-decay                    (saved)
  std::vector<float> o;                    // [T, H*D] KDA core output              (saved)
  std::vector<float> o_rstd;               // [T*H]    output RMSNorm 1/rms         (saved)
  std::vector<float> o_normed;             // [T, H*D] RMSNorm(o) * o_norm          (saved)
  std::vector<float> gate_lin;             // [T, H*D] W_g x                        (saved)
  std::vector<float> y;                    // [T, H*D] o_normed * sigmoid(gate), W_o input (saved)
  void ensure(int64_t T, const KDADims& dims);
};

// out [T, d] = KDA(x [T, d]); state carried in/out. T == 1 uses the decode step
// (kda_decode_step) whatever the path.
void kda_mixer_forward(float* out, KDAState& state, const float* x, const KDAWeights& w, const KDADims& dims,
                       int64_t T, KDAPath path, KDAScratch& scratch);

}  // namespace k3
