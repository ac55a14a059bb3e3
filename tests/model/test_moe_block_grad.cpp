// Stable LatentMoE block backward (model/moe_block.h): E = 8, k = 2, T = 9 with shared
// experts, the latent norm, renormalised routing with a routed scale and a balancing bias
// that changes the selection. The dense reference path in double against central finite
// differences of L = r . out + router_aux_loss (the auxiliary-loss hook): dx and every
// parameter gradient (router, down, up, latent norm, shared w1/w3/w2, each expert's
// w1/w3/w2), accumulating onto non-zero starts; selection margins are far above the FD step
// and each loss evaluation asserts the selection did not move. Then the grouped float
// backward against the double reference backward (rel RMS < 1e-4), and either backward on
// the other forward's saved activations.
#include <gtest/gtest.h>

#include <vector>

#include "common/fixture.h"
#include "kernels/router.h"
#include "common/grad_check.h"
#include "model/moe_block.h"

using namespace k3;
using test::check_fd;

namespace {

constexpr double kAlpha = 0.1;  // auxiliary-loss weight

struct MoECase {
  LatentMoEDims dm{};
  int64_t T = 9;
  // Parameters in LatentMoEGradsT order: router, down, up, latent_norm, shared w1, w3, w2,
  // then per expert w1, w3, w2.
  std::vector<std::vector<double>> p;
  std::vector<double> bias, x, r;
  std::vector<int32_t> idx0;

  MoECase() {
    dm = {10, 6, 5, 8, 2, 10, true, true, 1.7, 1e-5, 4.0, 25.0};
    const int64_t d = dm.d, l = dm.l, F = dm.F, E = dm.E, SF = dm.shared_width;
    p.push_back(test::randn(E * d, 1, 0.5));
    p.push_back(test::randn(l * d, 2, 0.4));
    p.push_back(test::randn(d * l, 3, 0.4));
    p.push_back(test::randn(l, 4, 0.2, 1.0));
    p.push_back(test::randn(SF * d, 5, 0.4));
    p.push_back(test::randn(SF * d, 6, 2.0));  // the shared up cap bends
    p.push_back(test::randn(d * SF, 7, 0.3));
    for (int64_t e = 0; e < E; ++e) {
      p.push_back(test::randn(F * l, 10 + 3 * unsigned(e), 0.8));
      p.push_back(test::randn(F * l, 11 + 3 * unsigned(e), 3.0));
      p.push_back(test::randn(l * F, 12 + 3 * unsigned(e), 0.5));
    }
    bias = test::randn(E, 50, 0.25);
    x = test::randn(T * d, 51);
    r = test::randn(T * d, 52);
    MoERoutingT<double> rt;
    forward(rt);
    idx0 = rt.idx;
  }
  template <typename R>
  LatentMoEWeightsT<R> weights(const std::vector<std::vector<R>>& q, const R* b) const {
    LatentMoEWeightsT<R> w{q[0].data(), b, q[1].data(), q[2].data(), q[3].data(), q[4].data(), q[5].data(),
                           q[6].data(), {}, {}, {}};
    for (int64_t e = 0; e < dm.E; ++e) {
      w.w1.push_back({q[7 + 3 * e].data(), nullptr, dm.F, dm.l});
      w.w3.push_back({q[8 + 3 * e].data(), nullptr, dm.F, dm.l});
      w.w2.push_back({q[9 + 3 * e].data(), nullptr, dm.l, dm.F});
    }
    return w;
  }
  template <typename R>
  static LatentMoEGradsT<R> grads(std::vector<std::vector<R>>& g, int64_t E) {
    LatentMoEGradsT<R> gr{g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(), g[5].data(), g[6].data(),
                          {}};
    for (int64_t e = 0; e < E; ++e)
      gr.experts.push_back({g[7 + 3 * e].data(), g[8 + 3 * e].data(), g[9 + 3 * e].data()});
    return gr;
  }
  // Double dense-reference forward on the current parameters; returns r . out + aux.
  double forward(MoERoutingT<double>& rt) {
    MoEScratchT<double> s;
    std::vector<double> out(T * dm.d);
    latent_moe_forward_dense_reference<double>(out.data(), x.data(), weights(p, bias.data()), dm, T, s, &rt);
    return test::dot(r, out) + router_aux_loss<double>(nullptr, rt.idx.data(), rt.scores.data(), T, dm.E, dm.k, kAlpha);
  }
  double loss() {
    MoERoutingT<double> rt;
    const double L = forward(rt);
    EXPECT_EQ(rt.idx, idx0) << "the finite-difference step changed the selection";
    return L;
  }
  double min_margin() const {
    MoEScratchT<double> s;
    MoERoutingT<double> rt;
    std::vector<double> out(T * dm.d);
    latent_moe_forward_dense_reference<double>(out.data(), x.data(), weights(p, bias.data()), dm, T, s, &rt);
    double m = 1e9;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t last = rt.idx[t * dm.k + dm.k - 1];
      double next = -1e9;
      for (int64_t e = 0; e < dm.E; ++e) {
        bool sel = false;
        for (int64_t i = 0; i < dm.k; ++i) sel = sel || rt.idx[t * dm.k + i] == e;
        if (!sel) next = std::max(next, rt.scores[t * dm.E + e] + bias[e]);
      }
      m = std::min(m, rt.scores[t * dm.E + last] + bias[last] - next);
    }
    return m;
  }
};

std::string name(size_t i) {
  static const char* fixed[7] = {"router", "down", "up", "latent_norm", "shared_w1", "shared_w3", "shared_w2"};
  if (i < 7) return fixed[i];
  static const char* ew[3] = {"w1", "w3", "w2"};
  return "expert " + std::to_string((i - 7) / 3) + " " + ew[(i - 7) % 3];
}

// Backward of the double dense reference (forward saved), with the aux hook; grads start
// at `start` and are returned with it subtracted.
std::vector<std::vector<double>> reference_backward(MoECase& c, std::vector<double>& dx,
                                                    const std::vector<std::vector<double>>& start) {
  MoEScratchT<double> s;
  LatentMoESavedT<double> saved;
  std::vector<double> out(c.T * c.dm.d);
  const auto w = c.weights(c.p, c.bias.data());
  latent_moe_forward_dense_reference<double>(out.data(), c.x.data(), w, c.dm, c.T, s, nullptr, &saved);
  std::vector<double> ds(c.T * c.dm.E);
  router_aux_loss<double>(ds.data(), saved.routing.idx.data(), saved.routing.scores.data(), c.T, c.dm.E, c.dm.k,
                          kAlpha);
  auto g = start;
  dx.assign(c.T * c.dm.d, 4.0);  // assigned
  latent_moe_backward_dense_reference<double>(dx.data(), MoECase::grads(g, c.dm.E), c.r.data(), saved, w, c.dm, c.T, s,
                                              ds.data());
  for (size_t i = 0; i < g.size(); ++i)
    for (size_t j = 0; j < g[i].size(); ++j) g[i][j] -= start[i][j];
  return g;
}

}  // namespace

TEST(LatentMoEGrad, DenseReferenceAgainstFiniteDifferences) {
  MoECase c;
  ASSERT_GT(c.min_margin(), 2e-3);
  {  // the bias changes the selection somewhere (so it is exercised), yet has no gradient
    MoEScratchT<double> s;
    MoERoutingT<double> rt;
    std::vector<double> out(c.T * c.dm.d);
    const auto nobias = c.weights(c.p, static_cast<const double*>(nullptr));
    latent_moe_forward_dense_reference<double>(out.data(), c.x.data(), nobias, c.dm, c.T, s, &rt);
    ASSERT_NE(rt.idx, c.idx0) << "pick a bias that changes the selection";
  }
  std::vector<std::vector<double>> start;
  unsigned seed = 300;
  for (auto& q : c.p) start.push_back(test::randn(int64_t(q.size()), seed++));
  std::vector<double> dx;
  const auto g = reference_backward(c, dx, start);
  std::vector<int> load(c.dm.E, 0);
  for (int32_t e : c.idx0) ++load[e];
  auto loss = [&] { return c.loss(); };
  check_fd(c.x, dx, loss, "moe dx", 1e-6, 1 << 30);
  for (size_t i = 0; i < c.p.size(); ++i) {
    const int64_t e = i < 7 ? -1 : int64_t(i - 7) / 3;
    if (e >= 0 && load[e] == 0) {  // an expert without tokens: untouched, and FD is zero
      for (double v : g[i]) EXPECT_EQ(v, 0.0) << name(i);
      continue;
    }
    check_fd(c.p[i], g[i], loss, name(i), 1e-6, 64);
  }
}

TEST(LatentMoEGrad, GroupedFloatMatchesDoubleReference) {
  MoECase c;
  ASSERT_GT(c.min_margin(), 2e-3);
  std::vector<std::vector<double>> zero;
  for (auto& q : c.p) zero.emplace_back(q.size(), 0.0);
  std::vector<double> dxd;
  const auto gd = reference_backward(c, dxd, zero);

  std::vector<std::vector<float>> pf;
  for (auto& q : c.p) pf.push_back(test::cast<float>(q));
  const auto bf = test::cast<float>(c.bias);
  const auto xf = test::cast<float>(c.x), rf = test::cast<float>(c.r);
  const auto w = c.weights(pf, bf.data());
  MoEScratch s;
  LatentMoESaved saved;
  std::vector<float> out(c.T * c.dm.d), out2(c.T * c.dm.d);
  latent_moe_forward(out.data(), xf.data(), w, c.dm, c.T, s, nullptr, &saved);
  latent_moe_forward(out2.data(), xf.data(), w, c.dm, c.T, s);
  EXPECT_EQ(out, out2) << "the training forward computes what inference does";
  ASSERT_EQ(saved.routing.idx, c.idx0);
  std::vector<float> ds(c.T * c.dm.E);
  router_aux_loss<float>(ds.data(), saved.routing.idx.data(), saved.routing.scores.data(), c.T, c.dm.E, c.dm.k, kAlpha);

  auto run = [&](bool grouped, const LatentMoESaved& sv, std::vector<float>& dx) {
    std::vector<std::vector<float>> g;
    for (auto& q : c.p) g.emplace_back(q.size(), 0.f);
    dx.assign(c.T * c.dm.d, 0.f);
    const auto gr = MoECase::grads(g, c.dm.E);
    if (grouped)
      latent_moe_backward(dx.data(), gr, rf.data(), sv, w, c.dm, c.T, s, ds.data());
    else
      latent_moe_backward_dense_reference<float>(dx.data(), gr, rf.data(), sv, w, c.dm, c.T, s, ds.data());
    return g;
  };
  std::vector<float> dxf;
  const auto gf = run(true, saved, dxf);
  EXPECT_LT(test::rel_rms_mixed(dxf.data(), dxd.data(), c.T * c.dm.d), 1e-4) << "dx";
  for (size_t i = 0; i < gd.size(); ++i) {
    double norm = 0;
    for (double v : gd[i]) norm += v * v;
    if (norm == 0) {
      for (float v : gf[i]) EXPECT_EQ(v, 0.f) << name(i);
      continue;
    }
    EXPECT_LT(test::rel_rms_mixed(gf[i].data(), gd[i].data(), int64_t(gd[i].size())), 1e-4) << name(i);
  }

  // Either backward on either forward's saved activations (one layout).
  LatentMoESaved saved_ref;
  latent_moe_forward_dense_reference<float>(out2.data(), xf.data(), w, c.dm, c.T, s, nullptr, &saved_ref);
  std::vector<float> dx_a, dx_b;
  const auto ga = run(false, saved, dx_a);      // reference backward, grouped forward's save
  const auto gb = run(true, saved_ref, dx_b);   // grouped backward, reference forward's save
  EXPECT_LT(test::rel_rms(dx_a.data(), dxf.data(), c.T * c.dm.d), 1e-5);
  EXPECT_LT(test::rel_rms(dx_b.data(), dxf.data(), c.T * c.dm.d), 1e-5);
  for (size_t i = 0; i < gf.size(); ++i) {
    double norm = 0;
    for (float v : gf[i]) norm += double(v) * v;
    if (norm == 0) continue;
    EXPECT_LT(test::rel_rms(ga[i].data(), gf[i].data(), int64_t(gf[i].size())), 1e-5) << name(i);
    EXPECT_LT(test::rel_rms(gb[i].data(), gf[i].data(), int64_t(gf[i].size())), 1e-5) << name(i);
  }
}
