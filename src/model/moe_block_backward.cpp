// Stable LatentMoE block backward (see moe_block.h; docs/model.md section 5): reverse mode
// through one forward from the activations in LatentMoESavedT, for that forward's routing.
// dx is assigned, parameter gradients accumulated (+=). The router bias is never
// differentiated: it only chose the experts, and the routing is taken as fixed.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/router.h"
#include "model/dense_ffn.h"
#include "model/moe_block.h"

namespace k3 {

namespace {


template <typename R>
void check_backward(const LatentMoEGradsT<R>& gr, const LatentMoESavedT<R>& sv, const LatentMoEWeightsT<R>& w,
                    const LatentMoEDims& dm, int64_t T, const R* x) {
  K3_ASSERT(T == sv.T, "latent_moe_backward: T differs from the saved forward's");
  K3_ASSERT(int64_t(w.w1.size()) == dm.E && int64_t(gr.experts.size()) == dm.E,
            "latent_moe_backward: expert count differs from n_experts");
  K3_ASSERT(gr.router && gr.down && gr.up && (!dm.use_norm || gr.latent_norm) &&
                (dm.shared_width == 0 || (gr.shared_w1 && gr.shared_w3 && gr.shared_w2)),
            "latent_moe_backward: missing gradient buffer");
  K3_ASSERT(int64_t(sv.routing.idx.size()) == T * dm.k && int64_t(sv.routing.scores.size()) == T * dm.E &&
                int64_t(sv.slot_y.size()) >= T * dm.k * dm.l,
            "latent_moe_backward: saved activations not sized for these dims");
  K3_ASSERT(x || (sv.keep_input && int64_t(sv.x.size()) >= T * dm.d), "latent_moe_backward: no block input");
}

}  // namespace

void latent_moe_backward(float* dx, const LatentMoEGrads& gr, const float* dout, const LatentMoESaved& sv,
                         const LatentMoEWeights& w, const LatentMoEDims& dm, int64_t T, MoEScratch& s,
                         const float* dscores_aux, const float* x_in) {
  check_backward(gr, sv, w, dm, T, x_in);
  if (T == 0) return;
  const int64_t d = dm.d, l = dm.l, k = dm.k, E = dm.E, SF = dm.shared_width;
  grow(s.un, T * l);
  grow(s.dun, T * l);
  grow(s.du, T * l);
  grow(s.dz, T * l);
  grow(s.dtopk_w, T * k);
  grow(s.dlogits, T * E);
  grow(s.dgu, T * 2 * SF);
  grow(s.dact, T * SF);
  const float* x = x_in ? x_in : sv.x.data();
  const float* u = sv.u.data();
  // The shared experts' SiTU output, recomputed with the forward's kernel (LatentMoESavedT).
  grow(s.act, T * SF, nullptr);
  situ_glu_forward<float>(s.act.data(), sv.shared_gu.data(), T, SF, dm.situ_b1, dm.situ_b2);
  // Recompute un = RMSNorm(u) * w_n from the saved 1/rms.
  const float* un = u;
  if (dm.use_norm) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < l; ++c) s.un[t * l + c] = u[t * l + c] * sv.u_rstd[t] * w.latent_norm[c];
    un = s.un.data();
  }
  // y = W_up un (+ shared)
  linear_backward<float>(s.dun.data(), gr.up, dout, un, w.up, T, l, d, false);
  // un = RMSNorm(u) * latent_norm
  const float* du = s.dun.data();
  if (dm.use_norm) {
    rmsnorm_backward<float>(s.du.data(), gr.latent_norm, s.dun.data(), u, w.latent_norm, sv.u_rstd.data(), T, l);
    du = s.du.data();
  }
  // Shared experts (y += W2s SiTU(W1s x, W3s x)), their weights' gradients and dgu: independent
  // of the routed experts, so they run inside moe_experts_backward (first, or in expert-parallel
  // training while the rows travel); their dx comes last, as dense_ffn_backward adds it.
  auto weights_half = [&] {
    if (SF == 0) return;
    dense_ffn_backward_weights<float>(gr.shared_w1, gr.shared_w3, gr.shared_w2, s.dgu.data(), s.dact.data(), dout,
                                      sv.shared_gu.data(), s.act.data(), x, w.shared_w2, T, d, SF, dm.situ_b1,
                                      dm.situ_b2);
  };
  const std::function<void()> shared_weights = [&weights_half] { weights_half(); };  // one reference: no allocation
  // u = sum_i p_i E_i(z): dz and d p (the mixture weights) per (token, slot).
  const MoERouting& r = sv.routing;
  moe_experts_backward(s.dz.data(), s.dtopk_w.data(), gr.experts.data(), du, sv.slot_gu.data(), sv.slot_y.data(),
                       sv.z.data(), r.idx.data(), r.weight.data(), w.w1.data(), w.w3.data(), w.w2.data(), T, l, dm.F,
                       E, k, dm.situ_b1, dm.situ_b2, s.experts, &shared_weights);
  // z = W_down x  (first write of dx)
  linear_backward<float>(dx, gr.down, s.dz.data(), x, w.down, T, d, l, false);
  // p = renormalised sigmoid(W_r x) of the selected experts (+ the auxiliary-loss hook).
  router_backward<float>(dx, gr.router, s.dlogits.data(), s.dtopk_w.data(), dscores_aux, r.idx.data(),
                         r.scores.data(), x, w.router, T, d, E, k, dm.renorm, dm.scale);
  // shared experts: dx += dgu_g W1s + dgu_u W3s
  if (SF > 0) dense_ffn_backward_input<float>(dx, s.dgu.data(), w.shared_w1, w.shared_w3, T, d, SF, /*accumulate_dx=*/true);
}

template <typename R>
void latent_moe_backward_dense_reference(R* dx, const LatentMoEGradsT<R>& gr, const R* dout,
                                         const LatentMoESavedT<R>& sv, const LatentMoEWeightsT<R>& w,
                                         const LatentMoEDims& dm, int64_t T, MoEScratchT<R>& s,
                                         const R* dscores_aux, const R* x_in) {
  check_backward(gr, sv, w, dm, T, x_in);
  const R* x = x_in ? x_in : sv.x.data();
  if (T == 0) return;
  const int64_t d = dm.d, l = dm.l, k = dm.k, E = dm.E, SF = dm.shared_width;
  grow(s.dtopk_w, T * k);
  grow(s.dlogits, T * E);
  std::vector<double> un(l), dun(l), dxt(d), g(std::max<int64_t>(SF, 1)), up(g.size()), a(g.size());
  std::vector<R> du(l), dz(l);
  const MoERoutingT<R>& r = sv.routing;
  for (int64_t t = 0; t < T; ++t) {
    const R* xt = x + t * d;
    const R* dy = dout + t * d;
    const R* ut = sv.u.data() + t * l;
    const double rs = dm.use_norm ? double(sv.u_rstd[t]) : 1.0;
    // Forward: un = u * rstd * w_n;  y = W_up un.
    for (int64_t c = 0; c < l; ++c) un[c] = double(ut[c]) * rs * (dm.use_norm ? double(w.latent_norm[c]) : 1.0);
    std::fill(dun.begin(), dun.end(), 0.0);
    for (int64_t o = 0; o < d; ++o)
      for (int64_t c = 0; c < l; ++c) {
        gr.up[o * l + c] += R(double(dy[o]) * un[c]);
        dun[c] += double(w.up[o * l + c]) * double(dy[o]);
      }
    // RMSNorm: du = rstd (dun w_n - u rstd mean(dun w_n u rstd)); d w_n += dun u rstd.
    if (dm.use_norm) {
      double dot = 0;
      for (int64_t c = 0; c < l; ++c) dot += dun[c] * double(w.latent_norm[c]) * double(ut[c]) * rs;
      dot /= double(l);
      for (int64_t c = 0; c < l; ++c) {
        gr.latent_norm[c] += R(dun[c] * double(ut[c]) * rs);
        du[c] = R(rs * (dun[c] * double(w.latent_norm[c]) - double(ut[c]) * rs * dot));
      }
    } else {
      for (int64_t c = 0; c < l; ++c) du[c] = R(dun[c]);
    }
    // u = sum_i p_i E_i(z) on this token.
    moe_experts_backward_reference<R>(dz.data(), s.dtopk_w.data() + t * k, gr.experts.data(), du.data(), nullptr,
                                      nullptr, sv.z.data() + t * l, r.idx.data() + t * k, r.weight.data() + t * k,
                                      w.w1.data(), w.w3.data(), w.w2.data(), 1, l, dm.F, E, k, dm.situ_b1,
                                      dm.situ_b2, s.experts);
    // z = W_down x
    std::fill(dxt.begin(), dxt.end(), 0.0);
    for (int64_t c = 0; c < l; ++c)
      for (int64_t i = 0; i < d; ++i) {
        gr.down[c * d + i] += R(double(dz[c]) * double(xt[i]));
        dxt[i] += double(w.down[c * d + i]) * double(dz[c]);
      }
    // Shared: y += W2s a, a = SiTU(W1s x, W3s x) (recomputed).
    for (int64_t j = 0; j < SF; ++j) {
      double gj = 0, uj = 0;
      for (int64_t i = 0; i < d; ++i) {
        gj += double(w.shared_w1[j * d + i]) * double(xt[i]);
        uj += double(w.shared_w3[j * d + i]) * double(xt[i]);
      }
      g[j] = gj, up[j] = uj, a[j] = situ(gj, uj, dm.situ_b1, dm.situ_b2);
    }
    for (int64_t j = 0; j < SF; ++j) {
      double da = 0;
      for (int64_t o = 0; o < d; ++o) {
        gr.shared_w2[o * SF + j] += R(double(dy[o]) * a[j]);
        da += double(w.shared_w2[o * SF + j]) * double(dy[o]);
      }
      double dg, dup;
      situ_grad(g[j], up[j], dm.situ_b1, dm.situ_b2, &dg, &dup);
      dg *= da;
      dup *= da;
      for (int64_t i = 0; i < d; ++i) {
        gr.shared_w1[j * d + i] += R(dg * double(xt[i]));
        gr.shared_w3[j * d + i] += R(dup * double(xt[i]));
        dxt[i] += dg * double(w.shared_w1[j * d + i]) + dup * double(w.shared_w3[j * d + i]);
      }
    }
    for (int64_t i = 0; i < d; ++i) dx[t * d + i] = R(dxt[i]);
  }
  // Router (its own FD-checked backward), dx +=.
  router_backward<R>(dx, gr.router, s.dlogits.data(), s.dtopk_w.data(), dscores_aux, r.idx.data(), r.scores.data(),
                     x, w.router, T, d, E, k, dm.renorm, dm.scale);
}

template void latent_moe_backward_dense_reference<float>(float*, const LatentMoEGradsT<float>&, const float*,
                                                         const LatentMoESavedT<float>&, const LatentMoEWeightsT<float>&,
                                                         const LatentMoEDims&, int64_t, MoEScratchT<float>&,
                                                         const float*, const float*);
template void latent_moe_backward_dense_reference<double>(double*, const LatentMoEGradsT<double>&, const double*,
                                                          const LatentMoESavedT<double>&,
                                                          const LatentMoEWeightsT<double>&, const LatentMoEDims&,
                                                          int64_t, MoEScratchT<double>&, const double*,
                                                          const double*);

}  // namespace k3
