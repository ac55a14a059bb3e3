// The op harness's test modes (see op_harness.h):
//   OpHarness/<op>.<case>.<backend>: every case of the table on every backend against its
//     reference (the binary repeats per SIMD target, simd_main/all_targets_main.cpp; the GPU
//     runs in the pass of the best target only, since its kernels do not depend on it);
//   OpGrad.<op>: the backward of every op that has one (the CPU's, in double) against central
//     finite differences of its forward in double.
// K3_OPS_SEED changes the inputs' seed (default: fixed per case); a failure names its seed.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <string>

#include "common/grad_check.h"
#include "core/simd_target.h"
#include "kernels/activations.h"
#include "kernels/attention.h"
#include "kernels/attn_res.h"
#include "kernels/kda.h"
#include "kernels/kda_backward_ref.h"
#include "kernels/kda_gate.h"
#include "kernels/norm.h"
#include "kernels/shortconv.h"
#include "ops/op_harness.h"

using namespace k3;
using namespace k3::test;

namespace {

uint64_t base_seed() {
  const char* e = std::getenv("K3_OPS_SEED");
  return e && *e ? std::strtoull(e, nullptr, 10) : 20261204;
}

std::string sci(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

struct Param {
  size_t case_index, backend_index;
};

// gtest prints a failing parameter: the case and backend, not their bytes.
[[maybe_unused]] void PrintTo(const Param& p, std::ostream* os) {
  *os << op_cases()[p.case_index].op << " " << op_cases()[p.case_index].name << " on "
      << harness_backends()[p.backend_index].name;
}

class OpHarness : public ::testing::TestWithParam<Param> {};

TEST_P(OpHarness, MatchesReference) {
  const OpCase& c = op_cases()[GetParam().case_index];
  const HarnessBackend& be = harness_backends()[GetParam().backend_index];
  if (!be.ops) GTEST_SKIP() << be.name << " absent: " << be.absent_reason;
  if (be.ops->device() && be.name == "cuda" && simd_target().bits != simd_targets_supported().front().bits)
    GTEST_SKIP() << "the GPU's ops do not depend on the CPU's SIMD target: checked in the first pass only";
  const uint64_t seed = base_seed() + 7919 * GetParam().case_index;
  OpBuffers b(be.ops->device());
  PreparedOp p = c.prepare(be, b, seed, true);
  p.run();
  if (be.ops->device()) be.ops->device()->synchronize();
  for (const OpOutput& o : p.outputs()) {
    const Comparison r = compare(o);
    // The error of every output, in the test report (scripts/gpu_check.sh prints them).
    RecordProperty("err_" + o.name, sci(r.rel));
    RecordProperty("tol_" + o.name, sci(o.tol));
    EXPECT_TRUE(r.failure.empty()) << c.op << " " << c.name << " on " << be.name << " (seed " << seed
                                   << "): " << r.failure;
  }
  RecordProperty("case", c.op + " " + c.name);
}

std::vector<Param> all_params() {
  std::vector<Param> v;
  for (size_t i = 0; i < op_cases().size(); ++i) {
    if (op_cases()[i].perf_only) continue;
    for (size_t b = 0; b < harness_backends().size(); ++b) v.push_back({i, b});
  }
  return v;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const OpCase& c = op_cases()[info.param.case_index];
  std::string s = c.op + "_" + std::to_string(info.param.case_index) + "_" + harness_backends()[info.param.backend_index].name;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Table, OpHarness, ::testing::ValuesIn(all_params()), param_name);

// ---- gradient mode: each backward against central differences in double ----

// L = sum(r * y) for y = forward(); the backward gets dL/dy = r.
double loss(const std::vector<double>& r, const std::vector<double>& y) { return dot(r, y); }

TEST(OpGrad, RmsNorm) {
  const int64_t rows = 3, dim = 10;
  std::vector<double> x = randn(rows * dim, 1), w = randn(dim, 2, 0.5, 1.0), r = randn(rows * dim, 3);
  std::vector<double> y(x.size()), rstd(static_cast<size_t>(rows)), dx(x.size()), dw(size_t(dim), 0.0);
  auto f = [&] {
    rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5);
    return loss(r, y);
  };
  f();
  rmsnorm_backward<double>(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, dim);
  check_fd(x.data(), dx.data(), int64_t(x.size()), f, "rmsnorm dx");
  check_fd(w.data(), dw.data(), dim, f, "rmsnorm dw");
}

TEST(OpGrad, L2Norm) {
  const int64_t rows = 4, dim = 8;
  std::vector<double> x = randn(rows * dim, 4), r = randn(rows * dim, 5), y(x.size()), inv(static_cast<size_t>(rows)), dx(x.size());
  auto f = [&] {
    l2norm_forward<double>(y.data(), inv.data(), x.data(), rows, dim, 1e-6);
    return loss(r, y);
  };
  f();
  l2norm_backward<double>(dx.data(), r.data(), x.data(), inv.data(), rows, dim);
  check_fd(x.data(), dx.data(), int64_t(x.size()), f, "l2norm dx");
}

TEST(OpGrad, ShortConvSiluWithCarriedState) {
  const int64_t T = 5, C = 3, K = 4;
  std::vector<double> x = randn(T * C, 6), w = randn(C * K, 7, 0.5), s0 = randn(C * (K - 1), 8), r = randn(T * C, 9);
  std::vector<double> y(x.size()), pre(x.size()), dx(x.size()), dw(w.size(), 0.0), ds(s0.size());
  auto f = [&] {
    std::vector<double> st = s0;
    shortconv_silu_forward<double>(y.data(), pre.data(), st.data(), x.data(), w.data(), T, C, K);
    return loss(r, y);
  };
  f();
  shortconv_silu_backward<double>(dx.data(), dw.data(), ds.data(), r.data(), pre.data(), s0.data(), x.data(), w.data(),
                                  T, C, K);
  check_fd(x.data(), dx.data(), int64_t(x.size()), f, "shortconv dx");
  check_fd(w.data(), dw.data(), int64_t(w.size()), f, "shortconv dw");
  check_fd(s0.data(), ds.data(), int64_t(s0.size()), f, "shortconv dstate0");
}

TEST(OpGrad, KdaGateBoundedAndUnbounded) {
  for (bool bounded : {true, false}) {
    const int64_t T = 3, H = 2, D = 4;
    std::vector<double> z = randn(T * H * D, 10), A = randn(H, 11, 0.5), dt = randn(H * D, 12, 0.5);
    std::vector<double> r = randn(T * H * D, 13), g(z.size()), dz(z.size()), dA(size_t(H), 0.0), ddt(dt.size(), 0.0);
    auto f = [&] {
      kda_gate_forward<double>(g.data(), z.data(), A.data(), dt.data(), T, H, D, bounded, -5.0);
      return loss(r, g);
    };
    f();
    kda_gate_backward<double>(dz.data(), dA.data(), ddt.data(), r.data(), z.data(), A.data(), dt.data(), T, H, D,
                              bounded, -5.0);
    const std::string tag = bounded ? "bounded " : "unbounded ";
    check_fd(z.data(), dz.data(), int64_t(z.size()), f, tag + "gate dz");
    check_fd(A.data(), dA.data(), H, f, tag + "gate dA_log");
    check_fd(dt.data(), ddt.data(), int64_t(dt.size()), f, tag + "gate ddt_bias");
  }
}

TEST(OpGrad, KdaRecurrenceWithCarriedState) {
  const int64_t T = 6, H = 2, D = 4;
  const double scale = 0.5;
  std::vector<double> q = randn(T * H * D, 14, 0.5), k = randn(T * H * D, 15, 0.5), v = randn(T * H * D, 16);
  std::vector<double> g = randn(T * H * D, 17, 0.3, -1.0), beta(size_t(T * H)), s0 = randn(H * D * D, 18, 0.2);
  for (size_t i = 0; i < beta.size(); ++i) beta[i] = 0.2 + 0.05 * double(i % 7);
  std::vector<double> r = randn(T * H * D, 19), rs = randn(H * D * D, 20), o(q.size());
  std::vector<double> dq(q.size()), dk(q.size()), dv(q.size()), dg(q.size()), db(beta.size()), ds0(s0.size());
  auto f = [&] {
    std::vector<double> S = s0;
    kda_recurrent_forward<double>(o.data(), S.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), T, H, D, D,
                                  scale);
    return loss(r, o) + dot(rs, S);  // the final state is an output too
  };
  f();
  kda_recurrent_backward<double>(dq.data(), dk.data(), dv.data(), dg.data(), db.data(), ds0.data(), r.data(),
                                 rs.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), s0.data(), T, H, D, D,
                                 scale);
  check_fd(q.data(), dq.data(), int64_t(q.size()), f, "kda dq");
  check_fd(k.data(), dk.data(), int64_t(k.size()), f, "kda dk");
  check_fd(v.data(), dv.data(), int64_t(v.size()), f, "kda dv");
  check_fd(g.data(), dg.data(), int64_t(g.size()), f, "kda dg");
  check_fd(beta.data(), db.data(), int64_t(beta.size()), f, "kda dbeta");
  check_fd(s0.data(), ds0.data(), int64_t(s0.size()), f, "kda dstate0");
}

TEST(OpGrad, AttentionWithPrefixAndSharedKeyPart) {
  AttentionDims ad;
  ad.Tq = 3;
  ad.P = 2;
  ad.H = 2;
  ad.Hkv = 1;
  ad.Dk = 4;
  ad.Dr = 2;
  ad.Dv = 3;
  ad.scale = 0.4;
  const int64_t Tk = 5;
  std::vector<double> q = randn(3 * 2 * 6, 21), k = randn(Tk * 4, 22), kr = randn(Tk * 2, 23), v = randn(Tk * 3, 24);
  std::vector<double> r = randn(3 * 2 * 3, 25), o(r.size()), lse(6);
  std::vector<double> dq(q.size()), dk(k.size()), dkr(kr.size()), dv(v.size());
  auto f = [&] {
    attention_forward_ref<double>(o.data(), q.data(), k.data(), kr.data(), v.data(), ad, lse.data());
    return loss(r, o);
  };
  f();
  attention_backward_ref<double>(dq.data(), dk.data(), dkr.data(), dv.data(), r.data(), o.data(), lse.data(), q.data(),
                                 k.data(), kr.data(), v.data(), ad);
  check_fd(q.data(), dq.data(), int64_t(q.size()), f, "attention dq");
  check_fd(k.data(), dk.data(), int64_t(k.size()), f, "attention dk");
  check_fd(kr.data(), dkr.data(), int64_t(kr.size()), f, "attention dkr");
  check_fd(v.data(), dv.data(), int64_t(v.size()), f, "attention dv");
}

TEST(OpGrad, AttnResRead) {
  const int64_t T = 3, d = 6, S = 3;
  std::vector<std::vector<double>> src = {randn(T * d, 26), randn(T * d, 27, 2.0), randn(T * d, 28)};
  std::vector<double> wn = randn(d, 29, 0.3, 1.0), wp = randn(d, 30, 0.5), r = randn(T * d, 31);
  std::vector<double> out(size_t(T * d)), alpha(size_t(T * S)), dwn(size_t(d), 0.0), dwp(size_t(d), 0.0);
  std::vector<std::vector<double>> ds(3, std::vector<double>(size_t(T * d), 0.0));
  auto f = [&] {
    const double* sp[3] = {src[0].data(), src[1].data(), src[2].data()};
    attn_res_forward<double>(out.data(), alpha.data(), sp, S, wn.data(), wp.data(), T, d, 1e-5);
    return loss(r, out);
  };
  f();
  const double* sp[3] = {src[0].data(), src[1].data(), src[2].data()};
  double* dsp[3] = {ds[0].data(), ds[1].data(), ds[2].data()};
  attn_res_backward<double>(dsp, dwn.data(), dwp.data(), r.data(), alpha.data(), sp, S, wn.data(), wp.data(), T, d, 1e-5);
  for (int s = 0; s < 3; ++s) check_fd(src[size_t(s)].data(), ds[size_t(s)].data(), T * d, f, "attn_res dsource");
  check_fd(wn.data(), dwn.data(), d, f, "attn_res dw_norm");
  check_fd(wp.data(), dwp.data(), d, f, "attn_res dw_proj");
}

TEST(OpGrad, SituGluAcrossTheCaps) {
  const int64_t rows = 3, F = 5;
  std::vector<double> gu = randn(rows * 2 * F, 32, 6.0), r = randn(rows * F, 33), act(size_t(rows * F)), dgu(gu.size());
  auto f = [&] {
    situ_glu_forward<double>(act.data(), gu.data(), rows, F, 4.0, 25.0);
    return loss(r, act);
  };
  f();
  situ_glu_backward<double>(dgu.data(), r.data(), gu.data(), rows, F, 4.0, 25.0);
  check_fd(gu.data(), dgu.data(), int64_t(gu.size()), f, "situ dgu");
}

}  // namespace
