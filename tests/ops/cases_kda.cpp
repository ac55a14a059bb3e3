// Op cases: the KDA core (docs/model.md section 3) on every core variant, one token and ragged
// multi-token calls, a carried state, the gate pinned at the floor -5 (the bounded Dense tiles'
// worst case) and the unbounded gate down to -50 (the Safe diagonal path). Reference: the
// token-by-token recurrence in double (kernels/kda.h kda_recurrent_forward).
#include <cmath>
#include <memory>
#include <string>

#include "kernels/kda.h"
#include "kernels/kda_fast.h"
#include "ops/op_harness.h"

namespace k3::test {

namespace {

const char* core_name(KDACore c) {
  switch (c) {
    case KDACore::Recurrent: return "recurrent";
    case KDACore::Chunked: return "chunked";
    case KDACore::Fast: return "fast";
    case KDACore::Step: return "step";
    case KDACore::StepFast: return "step-fast";
  }
  return "?";
}

enum class Gate { Bounded, Floor, Unbounded };

OpCase kda_case(KDACore core, int64_t T, int64_t H, int64_t D, Gate gate, bool perf_only = false) {
  OpCase c;
  c.op = "kda";
  c.name = std::string(core_name(core)) + " T=" + std::to_string(T) + " H=" + std::to_string(H) + " D=" +
           std::to_string(D) + (gate == Gate::Floor ? " gate at the floor -5" : gate == Gate::Unbounded ? " unbounded gate to -50" : "");
  c.perf_only = perf_only;
  c.flops = kda_chunk_fast_flops(T, H, D, D, 64, false);
  c.bytes = 4.0 * double(T * H * (4 * D + 1) + 2 * H * D * D);
  c.prepare = [=](const HarnessBackend& be, OpBuffers& b, uint64_t seed, bool reference) {
    std::mt19937_64 rng(seed);
    const int64_t n = T * H * D;
    std::vector<float> q = rand_f(rng, size_t(n)), k = rand_f(rng, size_t(n)), v = rand_f(rng, size_t(n));
    for (std::vector<float>* x : {&q, &k})  // L2-normalised per head, as the mixer feeds them
      for (int64_t r = 0; r < T * H; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += double((*x)[size_t(r * D + i)]) * (*x)[size_t(r * D + i)];
        for (int64_t i = 0; i < D; ++i) (*x)[size_t(r * D + i)] = float((*x)[size_t(r * D + i)] / std::sqrt(ss + 1e-6));
      }
    std::vector<float> g(static_cast<size_t>(n)), beta(size_t(T * H));
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    for (float& x : g) {
      const double u = u01(rng);
      x = gate == Gate::Floor ? -5.f : gate == Gate::Bounded ? float(-5.0 * u) : float(-50.0 * u - 0.01);
    }
    for (float& x : beta) x = float(0.05 + 0.9 * u01(rng));
    std::vector<float> S0 = rand_f(rng, size_t(H * D * D), 0.1);
    auto o = std::make_shared<std::vector<double>>();
    auto S = std::make_shared<std::vector<double>>(widen(S0));
    if (reference) {
      o->resize(static_cast<size_t>(n));
      std::vector<double> qd = widen(q), kd = widen(k), vd = widen(v), gd = widen(g), bd = widen(beta);
      kda_recurrent_forward<double>(o->data(), S->data(), qd.data(), kd.data(), vd.data(), gd.data(), bd.data(), T, H,
                                    D, D, 1.0 / std::sqrt(double(D)));
    }
    KDAFastOptions opt;
    opt.chunk = 64;
    opt.gate_bounded = gate != Gate::Unbounded;
    auto ws = std::make_shared<KDAWorkspace>();
    float* od = b.out(static_cast<size_t>(n));
    float* Sd = b.f(S0);
    const float *qd = b.f(q), *kd = b.f(k), *vd = b.f(v), *gd = b.f(g), *bd = b.f(beta);
    const Ops* ops = be.ops.get();
    PreparedOp po;
    po.run = [=] { ops->kda(core, od, Sd, qd, kd, vd, gd, bd, T, H, D, D, 1.0 / std::sqrt(double(D)), opt, *ws); };
    // f32 cores: rounding over T steps of the state (about 1e-5); bf16 tensor-core products
    // (the GPU's chunked form) round their operands to 8 bits of mantissa: 2e-2.
    const bool bf16 = be.bf16_products && (core == KDACore::Fast || core == KDACore::Chunked);
    const double tol = bf16 ? 2e-2 : 2e-4;
    const size_t ns = S0.size();
    po.outputs = [=, &b] {
      return std::vector<OpOutput>{{"o", widen(b.read(od, size_t(n))), *o, tol}, {"state", widen(b.read(Sd, ns)), *S, tol}};
    };
    return po;
  };
  return c;
}

}  // namespace

void add_kda_cases(std::vector<OpCase>& t) {
  for (KDACore core : {KDACore::Recurrent, KDACore::Chunked, KDACore::Fast, KDACore::Step, KDACore::StepFast}) {
    t.push_back(kda_case(core, 1, 3, 32, Gate::Bounded));
    t.push_back(kda_case(core, 17, 2, 32, Gate::Bounded));
  }
  for (KDACore core : {KDACore::Chunked, KDACore::Fast}) {
    t.push_back(kda_case(core, 130, 2, 64, Gate::Bounded));  // ragged last chunk
    t.push_back(kda_case(core, 200, 2, 32, Gate::Floor));
    t.push_back(kda_case(core, 150, 2, 32, Gate::Unbounded));
  }
  t.push_back(kda_case(KDACore::StepFast, 5, 4, 128, Gate::Floor));  // K3's head width, decode
  // K3's KDA shape (performance mode): the report's kernel.
  t.push_back(kda_case(KDACore::Fast, 8192, 96, 128, Gate::Bounded, true));
  t.push_back(kda_case(KDACore::Fast, 8192, 96, 128, Gate::Unbounded, true));
}

}  // namespace k3::test
