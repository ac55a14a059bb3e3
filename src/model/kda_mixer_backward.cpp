// KDA mixer backward (see kda_mixer.h; docs/model.md section 3): reverse mode through one
// forward call, from the activations in KDASavedT. Activation gradients are assigned, parameter
// gradients accumulated (+=); every projection's gradient is two k3::gemm products.
// Core: in double the recurrent reference (kda_recurrent_backward, the FD-checked root of
// the chain of trust); in float the fast chunked backward (kda_chunk_fast_backward), which
// reuses the fast forward's per-chunk states when the forward ran KDAPath::Fast and
// otherwise recomputes them from saved.S0.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/kda_backward_ref.h"
#include "kernels/kda_fast.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/shortconv.h"
#include "model/kda_mixer.h"

namespace k3 {


template <typename R>
void kda_mixer_backward(R* dx, const KDAGradsT<R>& gr, const R* dout, const KDASavedT<R>& sv,
                        const KDAWeightsT<R>& w, const KDADims& dims, int64_t T, KDAScratchT<R>& s,
                        const R* x_in) {
  const int64_t d = dims.d, H = dims.H, D = dims.D, HD = H * D, K = dims.conv_k;
  K3_ASSERT(T == sv.T, "kda_mixer_backward: T differs from the saved forward's");
  if (T == 0) return;
  K3_ASSERT(x_in || (sv.keep_input && int64_t(sv.x.size()) >= T * d), "kda_mixer_backward: no mixer input");
  K3_ASSERT(int64_t(sv.o.size()) >= T * HD && int64_t(sv.S0.size()) >= H * D * D &&
                int64_t(sv.conv_q0.size()) >= HD * (K - 1),
            "kda_mixer_backward: saved activations not sized for these dims");
  s.ensure_backward(T, dims);
  const R* x = x_in ? x_in : sv.x.data();

  // Recompute what the forward did not save (KDASavedT), with the forward's own kernels, so
  // the values are bit for bit the forward's: the conv outputs from the conv inputs and the
  // conv states the call started from, q and k L2-normalised, v = SiLU(v_pre), g = gate(z).
  {
    struct Conv {
      R *act, *pre;
      const R *state0, *lin, *taps;
    };
    const Conv convs[3] = {{s.q_act.data(), s.q_pre.data(), sv.conv_q0.data(), sv.q_lin.data(), w.q_conv},
                           {s.k_act.data(), s.k_pre.data(), sv.conv_k0.data(), sv.k_lin.data(), w.k_conv},
                           {s.v.data(), s.v_pre.data(), sv.conv_v0.data(), sv.v_lin.data(), w.v_conv}};
    for (const Conv& c : convs) {
      std::copy(c.state0, c.state0 + HD * (K - 1), s.conv0.data());
      shortconv_silu_forward<R>(c.act, c.pre, s.conv0.data(), c.lin, c.taps, T, HD, K);
    }
    l2norm_forward<R>(s.q.data(), nullptr, s.q_act.data(), T * H, D, kKdaL2Eps);
    l2norm_forward<R>(s.k.data(), nullptr, s.k_act.data(), T * H, D, kKdaL2Eps);
    kda_gate_forward<R>(s.g.data(), sv.z.data(), w.A_log, w.dt_bias, T, H, D, dims.bounded, dims.lower_bound);
  }
  R* on = s.o_normed.data();
  R* y = s.y.data();
  R* dy = s.dy.data();
  R* dgate = s.dgate.data();

  // Recompute o_normed = RMSNorm_head(o) * o_norm (saved 1/rms) and y = o_normed * sigmoid(gate).
#pragma omp parallel for schedule(static) if (T * HD > 65536)
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = 0; i < D; ++i) on[r * D + i] = sv.o[r * D + i] * sv.o_rstd[r] * w.o_norm[i];
#pragma omp parallel for schedule(static) if (T * HD > 65536)
  for (int64_t i = 0; i < T * HD; ++i) y[i] = on[i] * sigmoid(sv.gate_lin[i]);

  // out = W_o y
  linear_backward<R>(dy, gr.o_proj, dout, y, w.o_proj, T, HD, d, false);
  // y = o_normed * sigmoid(gate_lin): dgate_lin = dy o_normed s (1 - s); dy becomes d o_normed.
#pragma omp parallel for schedule(static) if (T * HD > 65536)
  for (int64_t i = 0; i < T * HD; ++i) {
    const R sg = sigmoid(sv.gate_lin[i]);
    dgate[i] = dy[i] * on[i] * sg * (R(1) - sg);
    dy[i] *= sg;
  }
  // gate_lin = W_g x  (first write of dx)
  linear_backward<R>(dx, gr.g_proj, dgate, x, w.g_proj, T, d, HD, false);
  // o_normed = RMSNorm(o) * o_norm, rows of D per head
  rmsnorm_backward<R>(s.d_o.data(), gr.o_norm, dy, sv.o.data(), w.o_norm, sv.o_rstd.data(), T * H, D);

  // o = KDA(q, k, v, g, beta; S0)
  const double scale = 1.0 / std::sqrt(double(D));
  R *dq = s.dq.data(), *dk = s.dk.data(), *dv = s.dv.data(), *dg = s.dg.data(), *dbeta = s.dbeta.data();
  if constexpr (std::is_same_v<R, float>) {
    // f32 fast chunked backward; the workspace holds the Fast forward's per-chunk states, or
    // (forward on another path) gets them from the backward's own state pass.
    kda_chunk_fast_backward(dq, dk, dv, dg, dbeta, nullptr, s.d_o.data(), nullptr, s.q.data(), s.k.data(),
                            s.v.data(), s.g.data(), sv.beta.data(), sv.S0.data(), T, H, D, D, scale,
                            kda_mixer_fast_options(dims, true), sv.ws);
  } else {
    // double: the recurrent reference backward (gradient checks).
    kda_recurrent_backward<R>(dq, dk, dv, dg, dbeta, nullptr, s.d_o.data(), nullptr, s.q.data(), s.k.data(),
                              s.v.data(), s.g.data(), sv.beta.data(), sv.S0.data(), T, H, D, D, scale);
  }

  // beta = sigmoid(W_b x)
  for (int64_t i = 0; i < T * H; ++i) dbeta[i] *= sv.beta[i] * (R(1) - sv.beta[i]);
  linear_backward<R>(dx, gr.b_proj, dbeta, x, w.b_proj, T, d, H, true);

  // g = gate(z, A_log, dt_bias); dg becomes dz in place
  kda_gate_backward<R>(dg, gr.A_log, gr.dt_bias, dg, sv.z.data(), w.A_log, w.dt_bias, T, H, D, dims.bounded,
                       dims.lower_bound);
  // z = W_fb fa;  fa = W_fa x
  linear_backward<R>(s.dfa.data(), gr.f_b, dg, sv.fa.data(), w.f_b, T, D, HD, false);
  linear_backward<R>(dx, gr.f_a, s.dfa.data(), x, w.f_a, T, d, D, true);

  // q = L2Norm(q_act), q_act = ShortConv_SiLU(q_lin), q_lin = W_q x; the same for k.
  struct QK {
    const R *dn, *pre, *inv, *conv0, *lin, *convw, *proj;
    R *dconv, *dproj;
  };
  const QK qk[2] = {
      {dq, s.q_pre.data(), sv.q_inv.data(), sv.conv_q0.data(), sv.q_lin.data(), w.q_conv, w.q_proj, gr.q_conv,
       gr.q_proj},
      {dk, s.k_pre.data(), sv.k_inv.data(), sv.conv_k0.data(), sv.k_lin.data(), w.k_conv, w.k_proj, gr.k_conv,
       gr.k_proj},
  };
  R* act = s.q_act.data();
  for (const QK& b : qk) {
#pragma omp parallel for schedule(static) if (T * HD > 65536)
    for (int64_t i = 0; i < T * HD; ++i) act[i] = silu(b.pre[i]);  // the L2Norm input, recomputed
    l2norm_backward<R>(s.dact.data(), b.dn, act, b.inv, T * H, D);
    shortconv_silu_backward<R>(s.dlin.data(), b.dconv, nullptr, s.dact.data(), b.pre, b.conv0, b.lin, b.convw, T,
                               HD, K);
    linear_backward<R>(dx, b.dproj, s.dlin.data(), x, b.proj, T, d, HD, true);
  }
  // v = ShortConv_SiLU(v_lin), v_lin = W_v x
  shortconv_silu_backward<R>(s.dlin.data(), gr.v_conv, nullptr, dv, s.v_pre.data(), sv.conv_v0.data(),
                             sv.v_lin.data(), w.v_conv, T, HD, K);
  linear_backward<R>(dx, gr.v_proj, s.dlin.data(), x, w.v_proj, T, d, HD, true);
}

template void kda_mixer_backward<float>(float*, const KDAGradsT<float>&, const float*, const KDASavedT<float>&,
                                        const KDAWeightsT<float>&, const KDADims&, int64_t, KDAScratchT<float>&,
                                        const float*);
template void kda_mixer_backward<double>(double*, const KDAGradsT<double>&, const double*,
                                         const KDASavedT<double>&, const KDAWeightsT<double>&, const KDADims&,
                                         int64_t, KDAScratchT<double>&, const double*);

}  // namespace k3
