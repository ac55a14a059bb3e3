// Gated MLA mixer backward (see mla_mixer.h; docs/model.md section 4): reverse mode through
// one full-sequence forward from the activations in MLASavedT. dx is assigned, every weight
// gradient accumulated (+=); each projection's gradient is two k3::gemm products. Attention:
// float runs attention_backward (blocked, recomputes the probabilities from the saved lse),
// double the plain reference attention_backward_ref (the gradient-check oracle).
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "model/mla_mixer.h"

namespace k3 {

template <typename R>
void mla_mixer_backward(R* dx, const MLAGradsT<R>& gr, const R* dout, const MLASavedT<R>& sv,
                        const MLAWeightsT<R>& w, const MLADims& dm, int64_t T, MLAScratchT<R>& s, const R* x_in) {
  K3_ASSERT(T == sv.T, "mla_mixer_backward: T differs from the saved forward's");
  K3_ASSERT(gr.q_a_proj && gr.q_a_norm && gr.q_b_proj && gr.kv_a_proj && gr.kv_a_norm && gr.kv_b_proj &&
                gr.o_proj && (!dm.output_gate || gr.g_proj),
            "mla_mixer_backward: missing gradient buffer");
  if (T == 0) return;
  const int64_t d = dm.d, H = dm.H, L = dm.kv_lora, Dq = dm.nope + dm.rope, KV = dm.nope + dm.v, A = L + dm.rope,
                HV = H * dm.v;
  K3_ASSERT(x_in || (sv.keep_input && int64_t(sv.x.size()) >= T * d), "mla_mixer_backward: no mixer input");
  K3_ASSERT(int64_t(sv.kv.size()) >= T * H * KV && int64_t(sv.lse.size()) >= T * H &&
                (!dm.output_gate || int64_t(sv.gate_lin.size()) >= T * HV),
            "mla_mixer_backward: saved activations not sized for these dims");
  grow(s.y, T * HV);
  grow(s.dy, T * HV);
  grow(s.dgate, T * HV);
  grow(s.d_o, T * HV);
  grow(s.dq, T * H * Dq);
  grow(s.dkv, T * H * KV);
  grow(s.dckv, T * L);
  grow(s.dkva, T * A);
  grow(s.dcq, T * dm.q_lora);
  grow(s.dcq_raw, T * dm.q_lora);
  const R* x = x_in ? x_in : sv.x.data();
  const R* o = sv.o.data();
  R* dy = s.dy.data();

  // Forward: y = o * sigmoid(gate_lin) (recomputed), out = W_o y.
  const R* y = o;
  if (dm.output_gate) {
    for (int64_t i = 0; i < T * HV; ++i) s.y[i] = o[i] * sigmoid(sv.gate_lin[i]);
    y = s.y.data();
  }
  linear_backward<R>(dy, gr.o_proj, dout, y, w.o_proj, T, HV, d, false);
  const R* d_o = dy;
  bool dx_written = false;
  if (dm.output_gate) {
    // y = o * sg: d gate_lin = dy o sg (1 - sg); d o = dy sg.
    for (int64_t i = 0; i < T * HV; ++i) {
      const R sg = sigmoid(sv.gate_lin[i]);
      s.dgate[i] = dy[i] * o[i] * sg * (R(1) - sg);
      s.d_o[i] = dy[i] * sg;
    }
    // gate_lin = W_g x  (first write of dx)
    linear_backward<R>(dx, gr.g_proj, s.dgate.data(), x, w.g_proj, T, d, HV, false);
    dx_written = true;
    d_o = s.d_o.data();
  }

  // o = attention(q, [k_nope | k_rope], v): k_rope is read from the saved kva's rope slice
  // (row stride A), so its gradient lands directly in dkva[:, L:].
  AttentionDims ad = mla_attention_dims(dm, T, 0);
  ad.kr_tok = A;
  R* dkv = s.dkv.data();
  R* dkva = s.dkva.data();
  const R* kv = sv.kv.data();
  const R* kr = sv.kva.data() + L;
  if constexpr (std::is_same_v<R, float>)
    attention_backward(s.dq.data(), dkv, dkva + L, dkv + dm.nope, d_o, o, sv.lse.data(), sv.q.data(), kv, kr,
                       kv + dm.nope, ad, s.attn);
  else
    attention_backward_ref<R>(s.dq.data(), dkv, dkva + L, dkv + dm.nope, d_o, o, sv.lse.data(), sv.q.data(), kv, kr,
                              kv + dm.nope, ad);

  // kv = W_kvb c_kv
  linear_backward<R>(s.dckv.data(), gr.kv_b_proj, dkv, sv.ckv.data(), w.kv_b_proj, T, L, H * KV, false);
  // c_kv = RMSNorm(kva[:, :L]) * kv_a_norm, rows of stride A.
  for (int64_t t = 0; t < T; ++t)
    rmsnorm_backward<R>(dkva + t * A, gr.kv_a_norm, s.dckv.data() + t * L, sv.kva.data() + t * A, w.kv_a_norm,
                        sv.ckv_rstd.data() + t, 1, L);
  // kva = W_kva x
  linear_backward<R>(dx, gr.kv_a_proj, dkva, x, w.kv_a_proj, T, d, A, dx_written);
  // q = W_qb c_q
  linear_backward<R>(s.dcq.data(), gr.q_b_proj, s.dq.data(), sv.cq.data(), w.q_b_proj, T, dm.q_lora, H * Dq, false);
  // c_q = RMSNorm(cq_raw) * q_a_norm
  rmsnorm_backward<R>(s.dcq_raw.data(), gr.q_a_norm, s.dcq.data(), sv.cq_raw.data(), w.q_a_norm, sv.cq_rstd.data(),
                      T, dm.q_lora);
  // cq_raw = W_qa x
  linear_backward<R>(dx, gr.q_a_proj, s.dcq_raw.data(), x, w.q_a_proj, T, d, dm.q_lora, true);
}

template void mla_mixer_backward<float>(float*, const MLAGradsT<float>&, const float*, const MLASavedT<float>&,
                                        const MLAWeightsT<float>&, const MLADims&, int64_t, MLAScratchT<float>&,
                                        const float*);
template void mla_mixer_backward<double>(double*, const MLAGradsT<double>&, const double*,
                                         const MLASavedT<double>&, const MLAWeightsT<double>&, const MLADims&,
                                         int64_t, MLAScratchT<double>&, const double*);

}  // namespace k3
