// Stable LatentMoE block: router, latent down-projection, routed experts, latent RMSNorm,
// up-projection, shared experts (see moe_block.h).
#include "model/moe_block.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/activations.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/router.h"
#include "model/dense_ffn.h"

namespace k3 {

static void check_dims(const LatentMoEWeights& w, const LatentMoEDims& dm) {
  K3_ASSERT(dm.d > 0 && dm.l > 0 && dm.F > 0 && dm.E > 0 && dm.k > 0 && dm.k <= dm.E && dm.shared_width >= 0,
            "latent_moe: bad dimensions");
  K3_ASSERT(int64_t(w.w1.size()) == dm.E && int64_t(w.w3.size()) == dm.E && int64_t(w.w2.size()) == dm.E,
            "latent_moe: expert count differs from n_experts");
  K3_ASSERT(w.router && w.down && w.up && (!dm.use_norm || w.latent_norm), "latent_moe: missing weight");
  K3_ASSERT(dm.shared_width == 0 || (w.shared_w1 && w.shared_w3 && w.shared_w2), "latent_moe: missing shared weight");
}

static MoERouting& route(MoERouting* routing_out, MoEScratch& s, const float* x, const LatentMoEWeights& w,
                         const LatentMoEDims& dm, int64_t T) {
  MoERouting& r = routing_out ? *routing_out : s.routing;
  r.idx.resize(size_t(T * dm.k));
  r.weight.resize(size_t(T * dm.k));
  r.scores.resize(size_t(T * dm.E));
  router_forward<float>(r.idx.data(), r.weight.data(), r.scores.data(), x, w.router, w.router_bias, T, dm.d, dm.E,
                        dm.k, dm.renorm, dm.scale);
  return r;
}

void latent_moe_forward(float* out, const float* x, const LatentMoEWeights& w, const LatentMoEDims& dm, int64_t T,
                        MoEScratch& s, MoERouting* routing_out) {
  check_dims(w, dm);
  if (T == 0) return;
  const MoERouting& r = route(routing_out, s, x, w, dm, T);
  auto grow = [](std::vector<float>& v, int64_t n) { if (v.size() < size_t(n)) v.resize(size_t(n)); };
  grow(s.z, T * dm.l);
  grow(s.u, T * dm.l);
  grow(s.un, T * dm.l);
  linear(s.z.data(), x, w.down, T, dm.d, dm.l);  // z = W_down x
  moe_experts_forward(s.u.data(), s.z.data(), r.idx.data(), r.weight.data(), w.w1.data(), w.w3.data(), w.w2.data(),
                      T, dm.l, dm.F, dm.E, dm.k, dm.situ_b1, dm.situ_b2, s.experts);
  const float* un = s.u.data();
  if (dm.use_norm) {
    rmsnorm_forward<float>(s.un.data(), nullptr, s.u.data(), w.latent_norm, T, dm.l, dm.rms_eps);
    un = s.un.data();
  }
  linear(out, un, w.up, T, dm.l, dm.d);  // W_up RMSNorm(u)
  if (dm.shared_width > 0) {
    grow(s.gu, T * 2 * dm.shared_width);
    grow(s.act, T * dm.shared_width);
    dense_ffn_forward<float>(out, s.gu.data(), s.act.data(), x, w.shared_w1, w.shared_w3, w.shared_w2, T, dm.d,
                             dm.shared_width, dm.situ_b1, dm.situ_b2, /*accumulate=*/true);
  }
}

// y[r] = W[r, :] . x in double (W [rows, cols] f32).
static void matvec(double* y, const float* W, const double* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += double(W[r * cols + c]) * x[c];
    y[r] = acc;
  }
}

void latent_moe_forward_dense_reference(float* out, const float* x, const LatentMoEWeights& w,
                                        const LatentMoEDims& dm, int64_t T, MoEScratch& s, MoERouting* routing_out) {
  check_dims(w, dm);
  if (T == 0) return;
  // Routing goes through the same float router as the fast path, so near-ties select the
  // same experts in both (the router has its own fixture test).
  const MoERouting& r = route(routing_out, s, x, w, dm, T);
  const int64_t d = dm.d, l = dm.l, SF = dm.shared_width;
  std::vector<double> xd(d), z(l), zf(l), y(d), g(std::max(SF, int64_t(1))), up(g.size()), a(g.size()), sh(d);
  std::vector<float> zt(l), ut(l);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < d; ++c) xd[c] = x[t * d + c];
    matvec(z.data(), w.down, xd.data(), l, d);
    for (int64_t c = 0; c < l; ++c) zt[c] = float(z[c]);
    // Routed experts on this one token (plain matrix-vector products, double accumulation).
    moe_experts_forward_reference(ut.data(), zt.data(), r.idx.data() + t * dm.k, r.weight.data() + t * dm.k,
                                  w.w1.data(), w.w3.data(), w.w2.data(), 1, l, dm.F, dm.E, dm.k, dm.situ_b1,
                                  dm.situ_b2, s.experts);
    double rs = 1;
    if (dm.use_norm) {
      double ss = 0;
      for (int64_t c = 0; c < l; ++c) ss += double(ut[c]) * ut[c];
      rs = 1 / std::sqrt(ss / double(l) + dm.rms_eps);
    }
    for (int64_t c = 0; c < l; ++c) zf[c] = ut[c] * rs * (dm.use_norm ? double(w.latent_norm[c]) : 1.0);
    matvec(y.data(), w.up, zf.data(), d, l);
    if (SF > 0) {
      matvec(g.data(), w.shared_w1, xd.data(), SF, d);
      matvec(up.data(), w.shared_w3, xd.data(), SF, d);
      for (int64_t j = 0; j < SF; ++j) a[j] = situ(g[j], up[j], dm.situ_b1, dm.situ_b2);
      matvec(sh.data(), w.shared_w2, a.data(), d, SF);
      for (int64_t c = 0; c < d; ++c) y[c] += sh[c];
    }
    for (int64_t c = 0; c < d; ++c) out[t * d + c] = float(y[c]);
  }
}

}  // namespace k3
