// Gated MLA mixer backward (model/mla_mixer.h) on the whole mixer (T = 7, H = 2; widths all
// different so a layout slip cannot cancel) against central finite differences in double:
// dx and all eight weight gradients (accumulating onto non-zero starts), with and without
// the output gate. Then the float backward (blocked attention recomputed from lse) against
// the double one, and the training forward (saved) == the inference forward.
#include <gtest/gtest.h>

#include <vector>

#include "common/grad_check.h"
#include "model/mla_mixer.h"

using namespace k3;
using test::check_fd;

namespace {

struct MLACase {
  MLADims dm{};
  int64_t T = 7;
  // weights in MLAWeightsT field order
  std::vector<double> qa, qan, qb, kva, kvan, kvb, o, g, x, r;

  explicit MLACase(bool gate) {
    dm = {12, 2, 8, 6, 4, 3, 5, gate, 1e-5};
    const int64_t Dq = dm.nope + dm.rope, A = dm.kv_lora + dm.rope, KV = dm.nope + dm.v, HV = dm.H * dm.v;
    qa = test::randn(dm.q_lora * dm.d, 1, 0.4);
    qan = test::randn(dm.q_lora, 2, 0.2, 1.0);
    qb = test::randn(dm.H * Dq * dm.q_lora, 3, 0.7);
    kva = test::randn(A * dm.d, 4, 0.5);
    kvan = test::randn(dm.kv_lora, 5, 0.2, 1.0);
    kvb = test::randn(dm.H * KV * dm.kv_lora, 6, 0.7);
    o = test::randn(dm.d * HV, 7, 0.4);
    g = test::randn(HV * dm.d, 8, 0.5);
    x = test::randn(T * dm.d, 9);
    r = test::randn(T * dm.d, 10);
  }
  std::vector<std::vector<double>*> params() { return {&qa, &qan, &qb, &kva, &kvan, &kvb, &o, &g}; }
  template <typename R>
  static MLAWeightsT<R> weights(std::vector<std::vector<R>>& p) {
    return {p[0].data(), p[1].data(), p[2].data(), p[3].data(), p[4].data(), p[5].data(), p[6].data(), p[7].data()};
  }
  MLAWeightsT<double> weights() {
    return {qa.data(), qan.data(), qb.data(), kva.data(), kvan.data(), kvb.data(), o.data(), g.data()};
  }
  double loss() {
    MLACacheT<double> cache;
    MLAScratchT<double> s;
    std::vector<double> out(T * dm.d);
    mla_mixer_forward<double>(out.data(), cache, x.data(), weights(), dm, T, s);
    return test::dot(r, out);
  }
};

const char* kNames[8] = {"q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "kv_b_proj", "o_proj", "g_proj"};

// Backward in R; grads start at `start` and the returned values have it subtracted.
template <typename R>
std::vector<std::vector<double>> backward(MLACase& c, std::vector<double>& dx_out,
                                          const std::vector<std::vector<double>>& start) {
  std::vector<std::vector<R>> w, gr;
  for (auto* p : c.params()) w.push_back(test::cast<R>(*p));
  for (auto& s0 : start) gr.push_back(test::cast<R>(s0));
  const auto x = test::cast<R>(c.x), r = test::cast<R>(c.r);
  MLACacheT<R> cache;
  MLAScratchT<R> s;
  MLASavedT<R> saved;
  std::vector<R> out(c.T * c.dm.d), dx(c.T * c.dm.d, R(3));
  const MLAWeightsT<R> wt = MLACase::weights(w);
  mla_mixer_forward<R>(out.data(), cache, x.data(), wt, c.dm, c.T, s, &saved);
  // The training forward computes what inference does.
  MLACacheT<R> cache2;
  std::vector<R> out2(out.size());
  mla_mixer_forward<R>(out2.data(), cache2, x.data(), wt, c.dm, c.T, s);
  EXPECT_EQ(out, out2);
  EXPECT_EQ(cache.c_kv, cache2.c_kv);
  const MLAGradsT<R> g{gr[0].data(), gr[1].data(), gr[2].data(), gr[3].data(),
                       gr[4].data(), gr[5].data(), gr[6].data(), c.dm.output_gate ? gr[7].data() : nullptr};
  mla_mixer_backward<R>(dx.data(), g, r.data(), saved, wt, c.dm, c.T, s);
  dx_out.assign(dx.begin(), dx.end());
  std::vector<std::vector<double>> res;
  for (size_t i = 0; i < gr.size(); ++i) {
    res.emplace_back(gr[i].size());
    for (size_t j = 0; j < gr[i].size(); ++j) res[i][j] = double(gr[i][j]) - start[i][j];
  }
  return res;
}

std::vector<std::vector<double>> starts(MLACase& c) {
  std::vector<std::vector<double>> s;
  unsigned seed = 100;
  for (auto* p : c.params()) s.push_back(test::randn(int64_t(p->size()), seed++));
  return s;
}

void check_case(bool gate) {
  MLACase c(gate);
  std::vector<double> dx;
  const auto st = starts(c);
  const auto grads = backward<double>(c, dx, st);
  auto loss = [&] { return c.loss(); };
  const std::string tag = gate ? "gated " : "ungated ";
  check_fd(c.x, dx, loss, tag + "dx", 1e-6, 1 << 30);
  auto params = c.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 7 && !gate) {
      for (size_t j = 0; j < grads[i].size(); ++j) EXPECT_EQ(grads[i][j], 0.0) << "g_proj without the gate";
      continue;
    }
    check_fd(*params[i], grads[i], loss, tag + kNames[i], 1e-6, 64);
  }
}

}  // namespace

TEST(MLAMixerGrad, GatedAgainstFiniteDifferences) { check_case(true); }

TEST(MLAMixerGrad, UngatedAgainstFiniteDifferences) { check_case(false); }

TEST(MLAMixerGrad, FloatBlockedMatchesDouble) {
  MLACase c(true);
  const auto st = starts(c);
  std::vector<double> dxd, dxf;
  const auto gd = backward<double>(c, dxd, st);
  const auto gf = backward<float>(c, dxf, st);
  EXPECT_LT(test::rel_rms_mixed(dxf.data(), dxd.data(), int64_t(dxd.size())), 1e-4) << "dx";
  for (size_t i = 0; i < gd.size(); ++i)
    EXPECT_LT(test::rel_rms_mixed(gf[i].data(), gd[i].data(), int64_t(gd[i].size())), 1e-4) << kNames[i];
}
