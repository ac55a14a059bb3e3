// Attention backward (kernels/attention.h): the plain reference against central finite
// differences in double (multi-head with a shared key part; a prefix with grouped kv heads;
// MLA's interleaved [k_nope | v] rows with k_rope read at a stride; absorbed decode's k = v
// alias), then the blocked float path (recompute from lse) against the double reference on
// the same layouts and on multi-tile sequences, and its determinism across thread counts.
#include <gtest/gtest.h>

#include <vector>

#include "core/threads.h"
#include "kernels/attention.h"
#include "common/grad_check.h"

using namespace k3;
using test::check_fd;

namespace {

// One layout: q, the kv buffer (k at offset 0, v at offset v_off; the same buffer when
// shared), kr; every gradient in its input's layout.
struct AttnCase {
  AttentionDims d;
  bool kv_shared = false;  // k and v in one buffer (interleaved or aliased)
  int64_t v_off = 0;       // v's offset in the shared buffer
  std::vector<double> q, k, v, kr, r;
  int64_t nq = 0, nk = 0, nv = 0, nkr = 0, no = 0;

  AttnCase(const AttentionDims& dims, bool shared, int64_t voff, unsigned seed)
      : d(dims), kv_shared(shared), v_off(voff) {
    const AttentionDims rd = d.resolved();
    const int64_t Tk = d.P + d.Tq;
    nq = (d.Tq - 1) * rd.q_tok + (d.H - 1) * rd.q_head + d.Dk + d.Dr;
    nk = (Tk - 1) * rd.k_tok + (d.Hkv - 1) * rd.k_head + d.Dk;
    nv = (Tk - 1) * rd.v_tok + (d.Hkv - 1) * rd.v_head + d.Dv;
    nkr = d.Dr ? (Tk - 1) * rd.kr_tok + d.Dr : 0;
    no = (d.Tq - 1) * rd.o_tok + (d.H - 1) * rd.o_head + d.Dv;
    q = test::randn(nq, seed);
    k = test::randn(shared ? std::max(nk, v_off + nv) : nk, seed + 1);
    if (!shared) v = test::randn(nv, seed + 2);
    kr = test::randn(nkr, seed + 3);
    r = test::randn(no, seed + 4);
  }
  const double* vp() const { return kv_shared ? k.data() + v_off : v.data(); }
  double loss() const {
    std::vector<double> o(no, 0.0);
    attention_forward_ref<double>(o.data(), q.data(), k.data(), d.Dr ? kr.data() : nullptr, vp(), d);
    return test::dot(r, o);
  }
};

void check_reference(AttnCase c, const std::string& tag) {
  std::vector<double> dq(c.q.size(), 7.0), dk(c.k.size(), 7.0), dv(c.v.size(), 7.0), dkr(c.kr.size(), 7.0);
  double* dvp = c.kv_shared ? dk.data() + c.v_off : dv.data();
  attention_backward_ref<double>(dq.data(), dk.data(), c.d.Dr ? dkr.data() : nullptr, dvp, c.r.data(), nullptr,
                                 nullptr, c.q.data(), c.k.data(), c.d.Dr ? c.kr.data() : nullptr, c.vp(), c.d);
  auto loss = [&] { return c.loss(); };
  // The gradients are assigned (the 7s must all be overwritten), except kr's row padding
  // (columns >= Dr of a wider row), which must be left alone; it is zeroed for the FD check.
  const AttentionDims rd = c.d.resolved();
  for (size_t i = 0; i < dkr.size(); ++i)
    if (int64_t(i) % rd.kr_tok >= c.d.Dr) {
      EXPECT_EQ(dkr[i], 7.0) << tag << " kr padding written";
      dkr[i] = 0.0;
    }
  check_fd(c.q, dq, loss, tag + " dq", 1e-6, 96);
  check_fd(c.k, dk, loss, tag + (c.kv_shared ? " d[k|v]" : " dk"), 1e-6, 96);
  if (!c.kv_shared) check_fd(c.v, dv, loss, tag + " dv", 1e-6, 96);
  if (c.d.Dr) check_fd(c.kr, dkr, loss, tag + " dkr", 1e-6, 96);
}

// Blocked float backward vs the double reference (and the saved lse vs the reference's).
void check_blocked(const AttnCase& c, const std::string& tag, double tol = 2e-5) {
  std::vector<double> od(c.no, 0.0), lsed(c.d.Tq * c.d.H);
  attention_forward_ref<double>(od.data(), c.q.data(), c.k.data(), c.d.Dr ? c.kr.data() : nullptr, c.vp(), c.d,
                                lsed.data());
  std::vector<double> dq(c.q.size(), 0.0), dk(c.k.size(), 0.0), dv(c.v.size(), 0.0), dkr(c.kr.size(), 0.0);
  attention_backward_ref<double>(dq.data(), dk.data(), dkr.data(), c.kv_shared ? dk.data() + c.v_off : dv.data(),
                                 c.r.data(), od.data(), lsed.data(), c.q.data(), c.k.data(), c.kr.data(), c.vp(), c.d);
  auto qf = test::cast<float>(c.q), kf = test::cast<float>(c.k), vf = test::cast<float>(c.v),
       krf = test::cast<float>(c.kr), rf = test::cast<float>(c.r);
  const float* vpf = c.kv_shared ? kf.data() + c.v_off : vf.data();
  std::vector<float> of(c.no, 0.f), lsef(c.d.Tq * c.d.H);
  AttentionScratch scratch;
  attention_forward(of.data(), qf.data(), kf.data(), c.d.Dr ? krf.data() : nullptr, vpf, c.d, scratch, lsef.data());
  EXPECT_LT(test::rel_rms_mixed(lsef.data(), lsed.data(), int64_t(lsed.size())), 1e-6) << tag << " lse";
  std::vector<float> dqf(c.q.size(), 0.f), dkf(c.k.size(), 0.f), dvf(c.v.size(), 0.f), dkrf(c.kr.size(), 0.f);
  float* dvpf = c.kv_shared ? dkf.data() + c.v_off : dvf.data();
  attention_backward(dqf.data(), dkf.data(), c.d.Dr ? dkrf.data() : nullptr, dvpf, rf.data(), of.data(), lsef.data(),
                     qf.data(), kf.data(), c.d.Dr ? krf.data() : nullptr, vpf, c.d, scratch);
  EXPECT_LT(test::rel_rms_mixed(dqf.data(), dq.data(), int64_t(dq.size())), tol) << tag << " dq";
  EXPECT_LT(test::rel_rms_mixed(dkf.data(), dk.data(), int64_t(dk.size())), tol) << tag << " dk";
  if (!c.kv_shared) {
    EXPECT_LT(test::rel_rms_mixed(dvf.data(), dv.data(), int64_t(dv.size())), tol) << tag << " dv";
  }
  if (c.d.Dr) {
    EXPECT_LT(test::rel_rms_mixed(dkrf.data(), dkr.data(), int64_t(dkr.size())), tol) << tag << " dkr";
  }
}

AttentionDims dims(int64_t Tq, int64_t P, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dr, int64_t Dv) {
  AttentionDims d;
  d.Tq = Tq, d.P = P, d.H = H, d.Hkv = Hkv, d.Dk = Dk, d.Dr = Dr, d.Dv = Dv;
  d.scale = 1.0 / std::sqrt(double(Dk + Dr));
  return d;
}

// MLA's expanded layout: kv [T, H, Dk + Dv] rows hold [k_nope | v]; k_rope read from a wider
// row (stride A, as the MLA backward reads it from the saved kva).
AttnCase mla_case(int64_t T, int64_t H, int64_t Dk, int64_t Dr, int64_t Dv, unsigned seed) {
  AttentionDims d = dims(T, 0, H, H, Dk, Dr, Dv);
  d.k_tok = d.v_tok = H * (Dk + Dv);
  d.k_head = d.v_head = Dk + Dv;
  d.kr_tok = Dr + 5;
  return AttnCase(d, true, Dk, seed);
}

// Absorbed decode: one kv head, keys = values = the latent rows (k and v alias).
AttnCase absorbed_case(unsigned seed) {
  AttentionDims d = dims(3, 4, 3, 1, 6, 2, 6);
  return AttnCase(d, true, 0, seed);
}

}  // namespace

TEST(AttentionGrad, ReferenceAgainstFiniteDifferences) {
  check_reference(AttnCase(dims(5, 0, 2, 2, 3, 2, 4), false, 0, 1), "multi-head + shared key");
  check_reference(AttnCase(dims(4, 3, 4, 2, 3, 0, 3), false, 0, 2), "prefix + grouped kv");
  check_reference(mla_case(5, 2, 3, 2, 4, 3), "mla interleaved");
  check_reference(absorbed_case(4), "absorbed k = v");
}

TEST(AttentionGrad, BlockedMatchesReference) {
  check_blocked(AttnCase(dims(5, 0, 2, 2, 3, 2, 4), false, 0, 11), "multi-head + shared key");
  check_blocked(AttnCase(dims(4, 3, 4, 2, 3, 0, 3), false, 0, 12), "prefix + grouped kv");
  check_blocked(mla_case(7, 2, 4, 3, 5, 13), "mla interleaved");
  check_blocked(absorbed_case(14), "absorbed k = v");
  // Several query tiles (64 rows per tile) with grouped heads, and one kv head over 130 tokens.
  check_blocked(AttnCase(dims(70, 5, 4, 2, 8, 4, 8), false, 0, 15), "multi-tile grouped");
  check_blocked(AttnCase(dims(130, 0, 2, 1, 8, 4, 6), false, 0, 16), "multi-tile one kv head");
  check_blocked(mla_case(90, 3, 8, 4, 8, 17), "multi-tile mla");
}

TEST(AttentionGrad, BlockedIsDeterministicAcrossThreads) {
  AttnCase c = mla_case(80, 4, 8, 4, 8, 21);
  auto qf = test::cast<float>(c.q), kf = test::cast<float>(c.k), krf = test::cast<float>(c.kr),
       rf = test::cast<float>(c.r);
  std::vector<float> o(c.no), lse(c.d.Tq * c.d.H);
  AttentionScratch s;
  attention_forward(o.data(), qf.data(), kf.data(), krf.data(), kf.data() + c.v_off, c.d, s, lse.data());
  auto run = [&](int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    std::vector<float> dq(c.q.size(), 0.f), dkv(c.k.size(), 0.f), dkr(c.kr.size(), 0.f);
    attention_backward(dq.data(), dkv.data(), dkr.data(), dkv.data() + c.v_off, rf.data(), o.data(), lse.data(),
                       qf.data(), kf.data(), krf.data(), kf.data() + c.v_off, c.d, s);
    set_num_threads(before);
    dq.insert(dq.end(), dkv.begin(), dkv.end());
    dq.insert(dq.end(), dkr.begin(), dkr.end());
    return dq;
  };
  const auto a = run(1), b = run(2), c2 = run(2);
  EXPECT_EQ(a, b);
  EXPECT_EQ(b, c2);
}
