// The model side of the post-training losses (posttrain/token_grad.h): masked targets get
// exactly zero gradient; the backward of a loss on the per-token log-probabilities and of the
// reverse KL of distillation match central finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/threads.h"
#include "posttrain/token_grad.h"
#include "posttrain_models.h"

using namespace k3;
using namespace k3::test;

namespace {

struct OneThread {
  OneThread() { set_num_threads(1); }
  ~OneThread() { set_num_threads(0); }
};

std::vector<int32_t> tokens(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(V));
  return t;
}

// A smooth objective of the log-probabilities with masked positions: the chain rule is
// checked, not one particular loss.
double objective(const double* logp, int64_t T, double* c, const std::vector<uint8_t>& mask) {
  double l = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (!mask[size_t(t)]) {
      if (c) c[t] = 0;
      continue;
    }
    const double w = 0.3 + 0.1 * double(t);
    l += w * std::exp(logp[t] + 1.0) + 0.2 * logp[t] * logp[t];
    if (c) c[t] = w * std::exp(logp[t] + 1.0) + 0.4 * logp[t];
  }
  return l;
}

// Entries to check: for each tensor its largest-gradient entry and two random ones.
template <typename F>
double worst_fd(K3ModelT<double>& m, const std::vector<double>& g, F&& loss) {
  const ParamLayout& lay = m.weights().layout();
  std::mt19937 rng(3);
  double worst = 0;
  const double h = 3e-5;
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& sp = lay.spec(i);
    if (sp.name.find("e_score_correction_bias") != std::string::npos) continue;
    const int64_t off = lay.offset(i), n = sp.numel();
    int64_t jmax = 0;
    for (int64_t j = 1; j < n; ++j)
      if (std::fabs(g[size_t(off + j)]) > std::fabs(g[size_t(off + jmax)])) jmax = j;
    for (int64_t j : {jmax, int64_t(rng() % uint64_t(n)), int64_t(rng() % uint64_t(n))}) {
      double* p = m.params() + off + j;
      const double p0 = *p;
      auto at = [&](double v) {
        *p = v;
        return loss();
      };
      const double d1 = at(p0 + h) - at(p0 - h), d2 = at(p0 + 2 * h) - at(p0 - 2 * h);
      *p = p0;
      const double want = (8 * d1 - d2) / (12 * h), got = g[size_t(off + j)];
      worst = std::max(worst, std::fabs(got - want) / (1e-4 + std::fabs(want)));
    }
  }
  return worst;
}

}  // namespace

TEST(TokenGrad, MaskedTargetsGetExactlyZeroGradient) {
  const OneThread one;
  const K3Config c = pt_config();
  const K3Model m(pt_store(c, 11));
  const int64_t T = 10;
  std::vector<int32_t> tok = tokens(T + 1, c.vocab_size, 2);
  // Targets 0..3 (a "prompt") and the last target masked.
  std::vector<uint8_t> mask = {0, 0, 0, 0, 1, 1, 1, 1, 1, 0};
  TrainScratch s;
  std::vector<float> g1(size_t(m.weights().size()), 0.f), g2 = g1;
  auto f = [&](const double* logp, int64_t n, double* cc) { return objective(logp, n, cc, mask); };
  token_objective_backward_t<float>(m, tok.data(), T, f, g1.data(), s);
  // The dlogits rows of masked targets are exactly zero (the backward's input).
  const int64_t V = c.vocab_size;
  for (int64_t t = 0; t < T; ++t) {
    double row = 0;
    for (int64_t v = 0; v < V; ++v) row += std::fabs(double(s.logits[size_t(t * V + v)]));
    if (mask[size_t(t)]) EXPECT_GT(row, 0.0) << t;
    else EXPECT_EQ(row, 0.0) << t;
  }
  // The last target is no input of any position: changing it leaves every parameter
  // gradient bitwise equal (a masked token contributes exactly nothing).
  tok[size_t(T)] = (tok[size_t(T)] + 7) % int32_t(V);
  token_objective_backward_t<float>(m, tok.data(), T, f, g2.data(), s);
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_EQ(g1[i], g2[i]) << i;
  // A fully masked sequence gives an all-zero gradient.
  std::vector<float> g3(g1.size(), 0.f);
  std::vector<uint8_t> none(size_t(T), 0);
  token_objective_backward_t<float>(m, tok.data(), T,
                                    [&](const double* logp, int64_t n, double* cc) { return objective(logp, n, cc, none); },
                                    g3.data(), s);
  for (float x : g3) ASSERT_EQ(x, 0.f);
}

TEST(TokenGrad, ObjectiveBackwardMatchesFiniteDifferencesInDouble) {
  const OneThread one;
  const K3Config c = pt_config();
  K3ModelT<double> m(pt_store(c, 5));
  const int64_t T = 8;
  const std::vector<int32_t> tok = tokens(T + 1, c.vocab_size, 9);
  const std::vector<uint8_t> mask = {0, 0, 1, 1, 0, 1, 1, 1};
  TrainScratchT<double> s;
  std::vector<double> g(size_t(m.weights().size()), 0.0), logp(static_cast<size_t>(T));
  auto f = [&](const double* lp, int64_t n, double* cc) { return objective(lp, n, cc, mask); };
  const double l0 = token_objective_backward_t<double>(m, tok.data(), T, f, g.data(), s, logp.data());
  std::vector<double> lp2(static_cast<size_t>(T));
  sequence_logprobs_t<double>(m, tok.data(), T, s, lp2.data());
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(logp[size_t(t)], lp2[size_t(t)]);
  EXPECT_EQ(l0, objective(lp2.data(), T, nullptr, mask));
  const double worst = worst_fd(m, g, [&] {
    sequence_logprobs_t<double>(m, tok.data(), T, s, lp2.data());
    return objective(lp2.data(), T, nullptr, mask);
  });
  EXPECT_LT(worst, 1e-5);
}

TEST(TokenGrad, ReverseKlBackwardMatchesFiniteDifferencesInDouble) {
  const OneThread one;
  const K3Config c = pt_config();
  K3ModelT<double> student(pt_store(c, 21)), teacher(pt_store(c, 22));
  const int64_t T = 7, V = c.vocab_size;
  const std::vector<int32_t> tok = tokens(T + 1, V, 4);
  const std::vector<uint8_t> mask = {0, 1, 1, 0, 1, 1, 1};
  TrainScratchT<double> s;
  std::vector<double> logq;
  sequence_log_softmax_t<double>(teacher, tok.data(), T, s, logq);
  std::vector<double> g(size_t(student.weights().size()), 0.0);
  const double kl = reverse_kl_backward_t<double>(student, tok.data(), T, logq.data(), mask.data(), 1.0, g.data(), s);
  EXPECT_GT(kl, 0.0);
  // KL of the student with itself is zero.
  std::vector<double> logp, g0(g.size(), 0.0);
  sequence_log_softmax_t<double>(student, tok.data(), T, s, logp);
  EXPECT_NEAR(reverse_kl_backward_t<double>(student, tok.data(), T, logp.data(), mask.data(), 1.0, g0.data(), s), 0.0,
              1e-12);
  auto kl_at = [&] {
    std::vector<double> lp;
    sequence_log_softmax_t<double>(student, tok.data(), T, s, lp);
    double k = 0;
    for (int64_t t = 0; t < T; ++t)
      if (mask[size_t(t)])
        for (int64_t v = 0; v < V; ++v)
          k += std::exp(lp[size_t(t * V + v)]) * (lp[size_t(t * V + v)] - logq[size_t(t * V + v)]);
    return k;
  };
  EXPECT_NEAR(kl_at(), kl, 1e-12);
  EXPECT_LT(worst_fd(student, g, kl_at), 1e-5);
}
