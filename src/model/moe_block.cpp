// Stable LatentMoE block: router, latent down-projection, routed experts, latent RMSNorm,
// up-projection, shared experts (see moe_block.h).
#include "model/moe_block.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/router.h"
#include "model/dense_ffn.h"

namespace k3 {

namespace {

template <typename R>
void check_dims(const LatentMoEWeightsT<R>& w, const LatentMoEDims& dm) {
  K3_ASSERT(dm.d > 0 && dm.l > 0 && dm.F > 0 && dm.E > 0 && dm.k > 0 && dm.k <= dm.E && dm.shared_width >= 0,
            "latent_moe: bad dimensions");
  K3_ASSERT(int64_t(w.w1.size()) == dm.E && int64_t(w.w3.size()) == dm.E && int64_t(w.w2.size()) == dm.E,
            "latent_moe: expert count differs from n_experts");
  K3_ASSERT(w.router.present() && w.down.present() && w.up.present() && (!dm.use_norm || w.latent_norm),
            "latent_moe: missing weight");
  K3_ASSERT(dm.shared_width == 0 || (w.shared_w1.present() && w.shared_w3.present() && w.shared_w2.present()),
            "latent_moe: missing shared weight");
}

// Routes into saved->routing (training), else routing_out, else the scratch's.
template <typename R>
MoERoutingT<R>& route(MoERoutingT<R>* routing_out, LatentMoESavedT<R>* saved, MoEScratchT<R>& s, const R* x,
                      const LatentMoEWeightsT<R>& w, const LatentMoEDims& dm, int64_t T) {
  MoERoutingT<R>& r = saved ? saved->routing : routing_out ? *routing_out : s.routing;
  r.idx.resize(size_t(T * dm.k));
  r.weight.resize(size_t(T * dm.k));
  r.scores.resize(size_t(T * dm.E));
  router_forward<R>(r.idx.data(), r.weight.data(), r.scores.data(), x, w.router, w.router_bias, T, dm.d, dm.E, dm.k,
                    dm.renorm, dm.scale);
  if (saved && routing_out) *routing_out = r;
  return r;
}

}  // namespace

template <typename R>
void LatentMoESavedT<R>::ensure(int64_t Tn, const LatentMoEDims& dm) {
  T = Tn;
  if (keep_input) grow(x, Tn * dm.d);
  grow(z, Tn * dm.l);
  grow(slot_gu, Tn * dm.k * 2 * dm.F);
  grow(slot_y, Tn * dm.k * dm.l);
  grow(u, Tn * dm.l);
  if (dm.use_norm) grow(u_rstd, Tn);
  grow(shared_gu, Tn * 2 * dm.shared_width);
}

template struct LatentMoESavedT<float>;
template struct LatentMoESavedT<double>;

void latent_moe_forward(const Ops& ops, float* out, const float* x, const LatentMoEWeights& w,
                        const LatentMoEDims& dm, int64_t T, MoEScratch& s, MoERouting* routing_out,
                        LatentMoESaved* saved) {
  Device* dev = ops.device();
  check_dims(w, dm);
  K3_ASSERT(!(saved || w.provider) || !dev, "latent_moe_forward: training saves and expert providers are CPU-only");
  if (saved) saved->ensure(T, dm);
  if (T == 0) return;
  // The routing lands in the saved record (training), the caller's routing_out (host, CPU), or
  // the scratch (then copied to a routing_out on the host).
  int32_t* idx;
  float *rw, *scores;
  MoERouting* host_r = saved ? &saved->routing : !dev ? routing_out : nullptr;
  if (host_r) {
    host_r->idx.resize(size_t(T * dm.k));
    host_r->weight.resize(size_t(T * dm.k));
    host_r->scores.resize(size_t(T * dm.E));
    idx = host_r->idx.data(), rw = host_r->weight.data(), scores = host_r->scores.data();
  } else {
    grow(s.idx, T * dm.k, dev);
    grow(s.weight, T * dm.k, dev);
    grow(s.scores, T * dm.E, dev);
    idx = s.idx.data(), rw = s.weight.data(), scores = s.scores.data();
  }
  ops.router(idx, rw, scores, x, w.router, w.router_bias, T, dm.d, dm.E, dm.k, dm.renorm, dm.scale);
  if (routing_out && host_r != routing_out) {
    if (saved) {
      *routing_out = saved->routing;
    } else {
      routing_out->idx.resize(size_t(T * dm.k));
      routing_out->weight.resize(size_t(T * dm.k));
      routing_out->scores.resize(size_t(T * dm.E));
      s.idx.read(routing_out->idx.data(), 0, size_t(T * dm.k));
      s.weight.read(routing_out->weight.data(), 0, size_t(T * dm.k));
      s.scores.read(routing_out->scores.data(), 0, size_t(T * dm.E));
    }
  }
  float *z, *u, *u_rstd = nullptr, *gu, *act;
  grow(s.act, T * dm.shared_width, dev);  // the shared SiTU output: recomputed by the backward
  act = s.act.data();
  if (saved) {
    if (saved->keep_input) std::copy(x, x + T * dm.d, saved->x.begin());
    z = saved->z.data();
    u = saved->u.data();
    if (dm.use_norm) u_rstd = saved->u_rstd.data();
    gu = saved->shared_gu.data();
  } else {
    grow(s.z, T * dm.l, dev);
    grow(s.u, T * dm.l, dev);
    grow(s.gu, T * 2 * dm.shared_width, dev);
    z = s.z.data(), u = s.u.data(), gu = s.gu.data();
  }
  grow(s.un, T * dm.l, dev);
  if (w.provider) {  // start reading the chosen experts now; the work below overlaps the reads
    moe_distinct_experts(s.distinct, idx, T, dm.k, dm.E);
    w.provider->prefetch(w.provider_layer, s.distinct.data(), int64_t(s.distinct.size()));
  }
  linear(ops, z, x, w.down, T, dm.d, dm.l);  // z = W_down x
  // Shared experts, first half: gu = [x W1s^T | x W3s^T], act = SiTU. Independent of the routed
  // experts: moe_experts_forward runs it first, or, in expert-parallel training, while the
  // experts' outputs travel back from their owners.
  auto first_half = [&] {
    if (dm.shared_width == 0) return;
    ops.gemm(false, true, T, dm.shared_width, dm.d, 1.f, x, dm.d, w.shared_w1, dm.d, 0.f, gu, 2 * dm.shared_width);
    ops.gemm(false, true, T, dm.shared_width, dm.d, 1.f, x, dm.d, w.shared_w3, dm.d, 0.f, gu + dm.shared_width,
             2 * dm.shared_width);
    ops.situ_glu(act, gu, T, dm.shared_width, dm.situ_b1, dm.situ_b2);
  };
  const std::function<void()> shared_first_half = [&first_half] { first_half(); };  // one reference: no allocation
  MoEExpertsExtras extras;
  extras.gu_saved = saved ? saved->slot_gu.data() : nullptr;
  extras.y_saved = saved ? saved->slot_y.data() : nullptr;
  extras.provider = w.provider;
  extras.overlap = &shared_first_half;
  ops.moe_experts(u, z, idx, rw, w.w1.data(), w.w3.data(), w.w2.data(), T, dm.l, dm.F, dm.E, dm.k, dm.situ_b1,
                  dm.situ_b2, s.experts, extras);
  const float* un = u;
  if (dm.use_norm) {
    ops.rmsnorm(s.un.data(), dm.l, u_rstd, u, dm.l, w.latent_norm, T, dm.l, dm.rms_eps);
    un = s.un.data();
  }
  linear(ops, out, un, w.up, T, dm.l, dm.d);  // W_up RMSNorm(u)
  // Shared experts, second half: out += act W2s^T (dense_ffn_forward's last step).
  if (dm.shared_width > 0) linear(ops, out, act, w.shared_w2, T, dm.shared_width, dm.d, /*accumulate=*/true);
}

namespace {

// y[r] = W[r, :] . x in double (W [rows, cols]; the reference reads f32 / double weights).
template <typename R>
void matvec(double* y, const MatT<R>& Wm, const double* x, int64_t rows, int64_t cols) {
  const R* W = Wm;
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += double(W[r * cols + c]) * x[c];
    y[r] = acc;
  }
}

}  // namespace

template <typename R>
void latent_moe_forward_dense_reference(R* out, const R* x, const LatentMoEWeightsT<R>& w, const LatentMoEDims& dm,
                                        int64_t T, MoEScratchT<R>& s, MoERoutingT<R>* routing_out,
                                        LatentMoESavedT<R>* saved) {
  check_dims(w, dm);
  if (saved) saved->ensure(T, dm);
  if (T == 0) return;
  // Routing goes through the same router as the fast path, so near-ties select the same
  // experts in both (the router has its own fixture test).
  const MoERoutingT<R>& r = route(routing_out, saved, s, x, w, dm, T);
  const int64_t d = dm.d, l = dm.l, SF = dm.shared_width, k = dm.k, F = dm.F;
  std::vector<double> xd(d), z(l), zf(l), y(d), g(std::max(SF, int64_t(1))), up(g.size()), a(g.size()), sh(d);
  std::vector<R> zt(l), ut(l);
  if (saved && saved->keep_input) std::copy(x, x + T * d, saved->x.begin());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < d; ++c) xd[c] = double(x[t * d + c]);
    matvec(z.data(), w.down, xd.data(), l, d);
    for (int64_t c = 0; c < l; ++c) zt[c] = R(z[c]);
    // Routed experts on this one token (plain matrix-vector products, double accumulation).
    moe_experts_forward_reference<R>(ut.data(), zt.data(), r.idx.data() + t * k, r.weight.data() + t * k,
                                     w.w1.data(), w.w3.data(), w.w2.data(), 1, l, F, dm.E, k, dm.situ_b1, dm.situ_b2,
                                     s.experts, saved ? saved->slot_gu.data() + t * k * 2 * F : nullptr,
                                     saved ? saved->slot_y.data() + t * k * l : nullptr);
    double rs = 1;
    if (dm.use_norm) {
      double ss = 0;
      for (int64_t c = 0; c < l; ++c) ss += double(ut[c]) * double(ut[c]);
      rs = 1 / std::sqrt(ss / double(l) + dm.rms_eps);
    }
    if (saved) {
      std::copy(zt.begin(), zt.end(), saved->z.begin() + t * l);
      std::copy(ut.begin(), ut.end(), saved->u.begin() + t * l);
      if (dm.use_norm) saved->u_rstd[t] = R(rs);
    }
    for (int64_t c = 0; c < l; ++c) zf[c] = double(ut[c]) * rs * (dm.use_norm ? double(w.latent_norm[c]) : 1.0);
    matvec(y.data(), w.up, zf.data(), d, l);
    if (SF > 0) {
      matvec(g.data(), w.shared_w1, xd.data(), SF, d);
      matvec(up.data(), w.shared_w3, xd.data(), SF, d);
      for (int64_t j = 0; j < SF; ++j) a[j] = situ(g[j], up[j], dm.situ_b1, dm.situ_b2);
      if (saved)
        for (int64_t j = 0; j < SF; ++j) {
          saved->shared_gu[t * 2 * SF + j] = R(g[j]);
          saved->shared_gu[t * 2 * SF + SF + j] = R(up[j]);
        }
      matvec(sh.data(), w.shared_w2, a.data(), d, SF);
      for (int64_t c = 0; c < d; ++c) y[c] += sh[c];
    }
    for (int64_t c = 0; c < d; ++c) out[t * d + c] = R(y[c]);
  }
}

template void latent_moe_forward_dense_reference<float>(float*, const float*, const LatentMoEWeightsT<float>&,
                                                        const LatentMoEDims&, int64_t, MoEScratchT<float>&,
                                                        MoERoutingT<float>*, LatentMoESavedT<float>*);
template void latent_moe_forward_dense_reference<double>(double*, const double*, const LatentMoEWeightsT<double>&,
                                                         const LatentMoEDims&, int64_t, MoEScratchT<double>&,
                                                         MoERoutingT<double>*, LatentMoESavedT<double>*);

}  // namespace k3
