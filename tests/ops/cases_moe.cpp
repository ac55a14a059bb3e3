// Op cases: the router (sigmoid scores, top-k of the biased scores, the unbiased weights
// renormalised; docs/model.md section 5) with clear margins, exact ties and a NaN score, and the
// routed SiTU-GLU experts with f32 and MXFP4 weights (docs/model.md section 8), one token and
// many, with experts that get no token and one expert every token picks. References: the
// router's selection rule and the experts' plain reference, in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>

#include "kernels/activations.h"
#include "kernels/moe.h"
#include "ops/op_harness.h"

namespace k3::test {

namespace {

enum class RouterInput { Clear, Ties, NaN };

OpCase router_case(int64_t T, int64_t d, int64_t E, int64_t k, RouterInput in) {
  OpCase c;
  c.op = "router";
  c.name = "T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
           (in == RouterInput::Ties ? " exact ties" : in == RouterInput::NaN ? " a NaN score" : " clear margins");
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool reference) {
    std::mt19937_64 rng(seed);
    std::vector<float> x = rand_f(rng, size_t(T * d)), W = rand_f(rng, size_t(E * d), 0.3);
    std::vector<float> bias = rand_f(rng, size_t(E), 0.05);
    if (in == RouterInput::Ties)  // experts 2j and 2j+1 share weights and bias: equal scores
      for (int64_t e = 1; e < E; e += 2) {
        std::copy_n(W.begin() + (e - 1) * d, d, W.begin() + e * d);
        bias[size_t(e)] = bias[size_t(e - 1)];
      }
    if (in == RouterInput::NaN) W[size_t(3 * d)] = std::numeric_limits<float>::quiet_NaN();  // expert 3
    // Reference: scores in double, the selection by (biased score desc, index asc, NaN last).
    std::vector<double> s(size_t(T * E)), w(size_t(T * k)), idx(size_t(T * k));
    bool clear = true;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> key(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        double a = 0;
        for (int64_t i = 0; i < d; ++i) a += double(x[size_t(t * d + i)]) * W[size_t(e * d + i)];
        s[size_t(t * E + e)] = sigmoid(a);
        key[size_t(e)] = std::isnan(a) ? -INFINITY : s[size_t(t * E + e)] + bias[size_t(e)];
      }
      std::vector<int64_t> ord(static_cast<size_t>(E));
      std::iota(ord.begin(), ord.end(), 0);
      std::stable_sort(ord.begin(), ord.end(), [&](int64_t a, int64_t b2) { return key[size_t(a)] > key[size_t(b2)]; });
      if (in == RouterInput::Clear && key[size_t(ord[size_t(k - 1)])] - key[size_t(ord[size_t(k)])] < 1e-4) clear = false;
      double sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += s[size_t(t * E + ord[size_t(i)])];
      for (int64_t i = 0; i < k; ++i) {
        idx[size_t(t * k + i)] = double(ord[size_t(i)]);
        w[size_t(t * k + i)] = s[size_t(t * E + ord[size_t(i)])] / (sum + 1e-20);
      }
    }
    int32_t* id = b.out_i(size_t(T * k));
    float* wd = b.out(size_t(T * k));
    float* sd = b.out(size_t(T * E));
    const float *xd = b.f(x), *Wd = b.f(W), *bd = b.f(bias);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->router(id, wd, sd, xd, Mat(Wd), bd, T, d, E, k, true, 1.0); };
    po.outputs = [=, &b] {
      std::vector<int32_t> gi = b.read_i(id, size_t(T * k));
      std::vector<OpOutput> o = {{"idx", std::vector<double>(gi.begin(), gi.end()), idx, 0},
                                 {"weight", widen(b.read(wd, w.size())), w, 1e-5},
                                 {"scores", widen(b.read(sd, s.size())), s, 1e-5}};
      if (!clear) o[0].want = o[0].got;  // a near-tie (< 1e-4 apart) may go either way in f32
      return o;
    };
    return po;
  };
  return c;
}

enum class Routing { Random, OneHot };

OpCase moe_case(int64_t T, int64_t n_in, int64_t F, int64_t E, int64_t k, bool mx, Routing r, bool perf_only = false) {
  OpCase c;
  c.op = "moe_experts";
  c.name = std::string(mx ? "MXFP4" : "f32") + " T=" + std::to_string(T) + " n_in=" + std::to_string(n_in) + " F=" +
           std::to_string(F) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
           (r == Routing::OneHot ? " one expert in every token's top-k, idle experts" : "");
  c.perf_only = perf_only;
  c.flops = 6.0 * double(T * k * n_in * F);
  c.bytes = double(std::min(E, T * k)) * 3.0 * double(n_in * F) * (mx ? 17.0 / 32.0 : 4.0);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool reference) {
    std::mt19937_64 rng(seed);
    std::vector<float> z = rand_f(rng, size_t(T * n_in));
    std::vector<int32_t> idx(size_t(T * k));
    std::vector<float> w(size_t(T * k));
    std::uniform_real_distribution<double> u01(0.05, 1.0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(E));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      if (r == Routing::OneHot) {  // expert 0 always, the others from the first half only
        std::vector<int32_t> half;
        for (int32_t e = 1; e < int32_t(E / 2); ++e) half.push_back(e);
        std::shuffle(half.begin(), half.end(), rng);
        all = {0};
        all.insert(all.end(), half.begin(), half.end());
      }
      for (int64_t i = 0; i < k; ++i) idx[size_t(t * k + i)] = all[size_t(i)], w[size_t(t * k + i)] = float(u01(rng));
    }
    // Weights: f32, or MXFP4 quantised from f32 (the reference reads the same bytes).
    std::vector<std::vector<float>> f1(static_cast<size_t>(E)), f3(static_cast<size_t>(E)), f2(static_cast<size_t>(E));
    std::vector<Mxfp4Matrix> m1(static_cast<size_t>(E)), m3(static_cast<size_t>(E)), m2(static_cast<size_t>(E));
    std::vector<std::vector<double>> d1(static_cast<size_t>(E)), d3(static_cast<size_t>(E)), d2(static_cast<size_t>(E));
    std::vector<ExpertMatrixT<double>> r1(static_cast<size_t>(E)), r3(static_cast<size_t>(E)), r2(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      f1[size_t(e)] = rand_f(rng, size_t(F * n_in), 0.2);
      f3[size_t(e)] = rand_f(rng, size_t(F * n_in), 0.2);
      f2[size_t(e)] = rand_f(rng, size_t(n_in * F), 0.2);
      if (mx) {
        m1[size_t(e)] = Mxfp4Matrix::quantize(Tensor::from_f32({F, n_in}, f1[size_t(e)].data()));
        m3[size_t(e)] = Mxfp4Matrix::quantize(Tensor::from_f32({F, n_in}, f3[size_t(e)].data()));
        m2[size_t(e)] = Mxfp4Matrix::quantize(Tensor::from_f32({n_in, F}, f2[size_t(e)].data()));
        r1[size_t(e)] = {nullptr, &m1[size_t(e)], F, n_in};
        r3[size_t(e)] = {nullptr, &m3[size_t(e)], F, n_in};
        r2[size_t(e)] = {nullptr, &m2[size_t(e)], n_in, F};
      } else {
        d1[size_t(e)] = widen(f1[size_t(e)]), d3[size_t(e)] = widen(f3[size_t(e)]), d2[size_t(e)] = widen(f2[size_t(e)]);
        r1[size_t(e)] = {d1[size_t(e)].data(), nullptr, F, n_in};
        r3[size_t(e)] = {d3[size_t(e)].data(), nullptr, F, n_in};
        r2[size_t(e)] = {d2[size_t(e)].data(), nullptr, n_in, F};
      }
    }
    auto want = std::make_shared<std::vector<double>>();
    if (reference) {
      want->resize(size_t(T * n_in));
      std::vector<double> zd = widen(z), wdd = widen(w);
      MoEExpertScratch rs;
      moe_experts_forward_reference<double>(want->data(), zd.data(), idx.data(), wdd.data(), r1.data(), r3.data(),
                                            r2.data(), T, n_in, F, E, k, 4.0, 25.0, rs);
    }
    const ExpertMatrix* e1 = mx ? b.experts_mx(m1) : b.experts_f32(f1, F, n_in);
    const ExpertMatrix* e3 = mx ? b.experts_mx(m3) : b.experts_f32(f3, F, n_in);
    const ExpertMatrix* e2 = mx ? b.experts_mx(m2) : b.experts_f32(f2, n_in, F);
    const size_t nu = size_t(T * n_in);
    float* u = b.out(nu);
    auto scratch = std::make_shared<MoEExpertScratch>();
    const float *zd = b.f(z), *wd = b.f(w);
    const int32_t* id = b.i(idx);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->moe_experts(u, zd, id, wd, e1, e3, e2, T, n_in, F, E, k, 4.0, 25.0, *scratch, {}); };
    po.outputs = [=, &b] { return std::vector<OpOutput>{{"u", widen(b.read(u, nu)), *want, 2e-5}}; };
    return po;
  };
  return c;
}

}  // namespace

void add_moe_cases(std::vector<OpCase>& t) {
  t.push_back(router_case(5, 48, 64, 8, RouterInput::Clear));
  t.push_back(router_case(3, 32, 40, 6, RouterInput::Ties));
  t.push_back(router_case(2, 32, 40, 6, RouterInput::NaN));
  for (bool mx : {false, true}) {
    t.push_back(moe_case(1, 64, 32, 16, 4, mx, Routing::Random));
    t.push_back(moe_case(9, 64, 64, 16, 4, mx, Routing::Random));
    t.push_back(moe_case(40, 96, 32, 12, 3, mx, Routing::OneHot));
  }
  // K3's widths (performance mode).
  // 16 experts at K3's widths: a decode step's 16 active experts, and a chunk's 16 x 32 rows
  // (the host draws and quantises every expert's weights: 1.7 GB of f32 on the way).
  t.push_back(moe_case(1, 3584, 3072, 16, 16, true, Routing::Random, true));
  t.push_back(moe_case(32, 3584, 3072, 16, 16, true, Routing::Random, true));
}

}  // namespace k3::test
