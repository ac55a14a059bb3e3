// KDA backward chain of trust (kernels/kda_backward_ref.h, kernels/kda_fast.h), all gradients
// (q, k, v, g, beta, initial state), with the final-state gradient as a second loss input:
//   1. the recurrent backward == central finite differences of the double recurrence;
//   2. the plain chunked backward == the recurrent backward (double, to rounding);
//   3. the fast backward (f32 and bf16, Dense and Safe, with and without the forward's
//      saved workspace) == the plain chunked backward;
// over lengths that are not multiples of the chunk, with and without an initial state.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "kernels/kda.h"
#include "kernels/kda_backward_ref.h"
#include "kernels/kda_fast.h"

using namespace k3;
using k3::test::rel_rms;

namespace {

struct Problem {
  int64_t T, H, Dk, Dv;
  double scale;
  std::vector<double> q, k, v, g, beta, s0, dO, dSf;  // dO, dSf: the loss weights
};

// Loss L = <o, dO> + <S_final, dSf>; g bounded in (-5, 0) with a floor-pinned channel.
Problem make_problem(int64_t T, int64_t H, int64_t Dk, int64_t Dv, bool state, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0, 1);
  std::uniform_real_distribution<double> u(0, 1);
  Problem p{T, H, Dk, Dv, 1 / std::sqrt(double(Dk)), {}, {}, {}, {}, {}, {}, {}, {}};
  p.q.resize(T * H * Dk), p.k.resize(T * H * Dk), p.v.resize(T * H * Dv), p.g.resize(T * H * Dk);
  p.beta.resize(T * H), p.s0.assign(H * Dk * Dv, 0.0), p.dO.resize(T * H * Dv), p.dSf.resize(H * Dk * Dv);
  for (auto* x : {&p.q, &p.k})
    for (int64_t r = 0; r < T * H; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < Dk; ++c) ss += ((*x)[r * Dk + c] = n(rng)) * (*x)[r * Dk + c];
      for (int64_t c = 0; c < Dk; ++c) (*x)[r * Dk + c] /= std::sqrt(ss);
    }
  for (auto& e : p.v) e = n(rng);
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t c = 0; c < Dk; ++c) p.g[r * Dk + c] = c == 0 ? -5.0 : -5.0 * u(rng) * u(rng);
  for (auto& e : p.beta) e = u(rng);
  if (state)
    for (auto& e : p.s0) e = 0.5 * n(rng);
  for (auto& e : p.dO) e = n(rng);
  for (auto& e : p.dSf) e = n(rng);
  return p;
}

struct Grads {
  std::vector<double> dq, dk, dv, dg, db, ds0;
};
const char* kNames[] = {"dq", "dk", "dv", "dg", "dbeta", "dstate0"};

Grads recurrent_grads(const Problem& p) {
  Grads r{std::vector<double>(p.q.size()), std::vector<double>(p.k.size()), std::vector<double>(p.v.size()),
          std::vector<double>(p.g.size()), std::vector<double>(p.beta.size()), std::vector<double>(p.s0.size())};
  kda_recurrent_backward<double>(r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.db.data(), r.ds0.data(),
                                 p.dO.data(), p.dSf.data(), p.q.data(), p.k.data(), p.v.data(), p.g.data(),
                                 p.beta.data(), p.s0.data(), p.T, p.H, p.Dk, p.Dv, p.scale);
  return r;
}

Grads chunk_grads(const Problem& p, int64_t chunk) {
  Grads r{std::vector<double>(p.q.size()), std::vector<double>(p.k.size()), std::vector<double>(p.v.size()),
          std::vector<double>(p.g.size()), std::vector<double>(p.beta.size()), std::vector<double>(p.s0.size())};
  kda_chunk_backward<double>(r.dq.data(), r.dk.data(), r.dv.data(), r.dg.data(), r.db.data(), r.ds0.data(),
                             p.dO.data(), p.dSf.data(), p.q.data(), p.k.data(), p.v.data(), p.g.data(), p.beta.data(),
                             p.s0.data(), p.T, p.H, p.Dk, p.Dv, p.scale, chunk);
  return r;
}

std::vector<float> F(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

// The fast backward, after a forward into the same workspace when `saved`.
std::vector<std::vector<float>> fast_grads(const Problem& p, const KDAFastOptions& opt0, bool saved) {
  auto q = F(p.q), k = F(p.k), v = F(p.v), g = F(p.g), b = F(p.beta), s0 = F(p.s0), dO = F(p.dO), dSf = F(p.dSf);
  KDAWorkspace ws;
  KDAFastOptions opt = opt0;
  opt.save_for_backward = saved;
  if (saved) {
    std::vector<float> o(p.T * p.H * p.Dv), s = s0;
    kda_chunk_fast_forward(o.data(), s.data(), q.data(), k.data(), v.data(), g.data(), b.data(), p.T, p.H, p.Dk, p.Dv,
                           p.scale, opt, ws);
    EXPECT_TRUE(ws.has_saved());
  }
  std::vector<std::vector<float>> r = {std::vector<float>(q.size(), 777.f), std::vector<float>(k.size(), 777.f),
                                       std::vector<float>(v.size(), 777.f), std::vector<float>(g.size(), 777.f),
                                       std::vector<float>(b.size(), 777.f), std::vector<float>(s0.size(), 777.f)};
  kda_chunk_fast_backward(r[0].data(), r[1].data(), r[2].data(), r[3].data(), r[4].data(), r[5].data(), dO.data(),
                          dSf.data(), q.data(), k.data(), v.data(), g.data(), b.data(), s0.data(), p.T, p.H, p.Dk,
                          p.Dv, p.scale, opt, ws);
  return r;
}

double loss(const Problem& p) {
  std::vector<double> o(p.T * p.H * p.Dv), s = p.s0;
  kda_recurrent_forward<double>(o.data(), s.data(), p.q.data(), p.k.data(), p.v.data(), p.g.data(), p.beta.data(),
                                p.T, p.H, p.Dk, p.Dv, p.scale);
  double L = 0;
  for (size_t i = 0; i < o.size(); ++i) L += o[i] * p.dO[i];
  for (size_t i = 0; i < s.size(); ++i) L += s[i] * p.dSf[i];
  return L;
}

}  // namespace

TEST(KdaBackwardRef, RecurrentMatchesFiniteDifferences) {
  Problem p = make_problem(11, 2, 5, 6, true, 3);
  const Grads gr = recurrent_grads(p);
  std::vector<double>* xs[] = {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.s0};
  const std::vector<double>* ds[] = {&gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.db, &gr.ds0};
  const double h = 1e-6;
  for (int a = 0; a < 6; ++a)
    for (size_t i = 0; i < xs[a]->size(); i += 3) {
      const double x0 = (*xs[a])[i];
      (*xs[a])[i] = x0 + h;
      const double lp = loss(p);
      (*xs[a])[i] = x0 - h;
      const double lm = loss(p);
      (*xs[a])[i] = x0;
      EXPECT_NEAR((*ds[a])[i], (lp - lm) / (2 * h), 1e-7) << kNames[a] << "[" << i << "]";
    }
}

TEST(KdaBackwardRef, ChunkedMatchesRecurrent) {
  for (auto [T, chunk, state] : {std::tuple<int64_t, int64_t, bool>{37, 16, true}, {100, 64, false}, {64, 64, true},
                                 {5, 64, true}}) {
    const Problem p = make_problem(T, 2, 12, 10, state, unsigned(T));
    const Grads a = recurrent_grads(p), b = chunk_grads(p, chunk);
    const std::vector<double>*ra[] = {&a.dq, &a.dk, &a.dv, &a.dg, &a.db, &a.ds0},
    *rb[] = {&b.dq, &b.dk, &b.dv, &b.dg, &b.db, &b.ds0};
    for (int i = 0; i < 6; ++i)
      EXPECT_LT(rel_rms(rb[i]->data(), ra[i]->data(), int64_t(ra[i]->size())), 1e-11)
          << kNames[i] << " T=" << T << " chunk=" << chunk;
  }
}

TEST(KdaFastBackward, MatchesChunkedReference) {
  struct Case {
    int64_t T, H, Dk, Dv, chunk;
    bool state;
  };
  for (const Case& c : {Case{100, 2, 32, 16, 64, true}, Case{37, 3, 16, 16, 16, false},
                        Case{200, 2, 40, 24, 64, true}, Case{130, 2, 128, 128, 64, true},
                        Case{70, 1, 24, 40, 32, false}}) {
    const Problem p = make_problem(c.T, c.H, c.Dk, c.Dv, c.state, unsigned(c.T + c.Dk));
    const Grads ref = chunk_grads(p, c.chunk);
    const std::vector<double>* rr[] = {&ref.dq, &ref.dk, &ref.dv, &ref.dg, &ref.db, &ref.ds0};
    for (bool bf : {false, true})
      for (auto diag : {KDAFastOptions::DiagPath::Dense, KDAFastOptions::DiagPath::Safe})
        for (bool saved : {false, true}) {
          if (bf && !saved) continue;  // the bf16 recompute path is the same code as f32's
          KDAFastOptions opt;
          opt.bf16 = bf;
          opt.diag = diag;
          opt.chunk = c.chunk;
          const auto fg = fast_grads(p, opt, saved);
          for (int i = 0; i < 6; ++i) {
            std::vector<double> a(fg[i].begin(), fg[i].end());
            // dg sums many cancelling terms (reverse cumulative sums of per-channel products)
            const double tol = bf ? (i == 3 ? 3e-2 : 1.5e-2) : (i == 3 ? 2e-5 : 5e-6);
            EXPECT_LT(rel_rms(a.data(), rr[i]->data(), int64_t(a.size())), tol)
                << kNames[i] << " T=" << c.T << " Dk=" << c.Dk << " Dv=" << c.Dv << " bf16=" << bf
                << (diag == KDAFastOptions::DiagPath::Dense ? " dense" : " safe") << " saved=" << saved;
          }
        }
  }
}

TEST(KdaFastBackward, NullStateArguments) {
  // state0 = null means zeros, dstate_final = null means zero, dstate0 may be null.
  const Problem p = make_problem(50, 2, 16, 16, false, 77);
  Problem pz = p;
  std::fill(pz.dSf.begin(), pz.dSf.end(), 0.0);
  const Grads ref = chunk_grads(pz, 64);
  auto q = F(p.q), k = F(p.k), v = F(p.v), g = F(p.g), b = F(p.beta), dO = F(p.dO);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dg(g.size()), db(b.size());
  KDAWorkspace ws;
  kda_chunk_fast_backward(dq.data(), dk.data(), dv.data(), dg.data(), db.data(), nullptr, dO.data(), nullptr, q.data(),
                          k.data(), v.data(), g.data(), b.data(), nullptr, p.T, p.H, p.Dk, p.Dv, p.scale,
                          KDAFastOptions{}, ws);
  std::vector<double> a(dk.begin(), dk.end());
  EXPECT_LT(rel_rms(a.data(), ref.dk.data(), int64_t(a.size())), 5e-6);
  a.assign(dg.begin(), dg.end());
  EXPECT_LT(rel_rms(a.data(), ref.dg.data(), int64_t(a.size())), 2e-5);
}
