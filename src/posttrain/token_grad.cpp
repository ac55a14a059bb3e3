// One sequence's log-probabilities and the backward of a loss on them (see token_grad.h).
#include "posttrain/token_grad.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/log_sum_exp.h"

namespace k3 {

namespace {

template <typename R>
void forward_rows(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s, bool record,
                  const EmbedSpliceT<R>* splice = nullptr) {
  const ModelDims& dm = model.dims();
  if (T < 1) fail("a post-training sequence needs at least one target");
  for (int64_t t = 1; t <= T; ++t)
    if (tokens[t] < 0 || tokens[t] >= dm.V)
      fail("token id " + std::to_string(tokens[t]) + " at position " + std::to_string(t) +
           " is outside the vocabulary [0, " + std::to_string(dm.V) + ")");
  if (record && model.weights().expert_storage() != ExpertStorage::Plain)
    fail("post-training needs f32 routed experts, but the model holds them as MXFP4");
  if (s.logits.size() < size_t(T * dm.V)) s.logits.resize(size_t(T * dm.V));
  s.st.reset(dm);
  ForwardOptions fo;
  fo.mode = MixerMode::Prefill;
  model.forward(s.logits.data(), tokens, T, s.st, s.fwd, fo, record ? &s.rec : nullptr, splice);
}

}  // namespace

template <typename R>
void sequence_logprobs_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s,
                         double* logp, const EmbedSpliceT<R>* splice) {
  forward_rows(model, tokens, T, s, false, splice);
  const int64_t V = model.dims().V;
  for (int64_t t = 0; t < T; ++t) {
    const R* l = s.logits.data() + t * V;
    logp[t] = double(l[tokens[t + 1]]) - log_sum_exp(l, V);
  }
}

template <typename R>
double token_objective_backward_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T,
                                  const TokenObjective& f, R* grads, TrainScratchT<R>& s, double* logp_out,
                                  const EmbedSpliceT<R>* splice) {
  forward_rows(model, tokens, T, s, true, splice);
  const int64_t V = model.dims().V;
  std::vector<double> lse(static_cast<size_t>(T)), logp(static_cast<size_t>(T)), c(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const R* l = s.logits.data() + t * V;
    lse[size_t(t)] = log_sum_exp(l, V);
    logp[size_t(t)] = double(l[tokens[t + 1]]) - lse[size_t(t)];
  }
  if (logp_out) std::copy(logp.begin(), logp.end(), logp_out);
  const double loss = f(logp.data(), T, c.data());
  // dL/dlogits_t = c_t (onehot(y_t) - softmax_t); the logits buffer becomes dlogits.
  for (int64_t t = 0; t < T; ++t) {
    R* l = s.logits.data() + t * V;
    const double ct = c[size_t(t)];
    if (ct == 0.0) {
      std::fill(l, l + V, R(0));
      continue;
    }
    for (int64_t v = 0; v < V; ++v) l[v] = R(-ct * std::exp(double(l[v]) - lse[size_t(t)]));
    l[tokens[t + 1]] += R(ct);
  }
  // Image positions: their gradient goes to the splice's rows (the caller's drows, or a buffer
  // nothing reads: a frozen encoder), never to the placeholder's embedding row.
  std::vector<R> drows_local;
  EmbedSpliceT<R> sp;
  if (splice) {
    sp = *splice;
    if (!sp.drows) {
      drows_local.assign(size_t(sp.n * model.dims().d), R(0));
      sp.drows = drows_local.data();
    }
  }
  model.backward(grads, s.logits.data(), tokens, s.rec, s.bwd, s.fwd.layer, nullptr, splice ? &sp : nullptr);
  return loss;
}

template <typename R>
void sequence_log_softmax_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s,
                            std::vector<double>& rows) {
  forward_rows(model, tokens, T, s, false);
  const int64_t V = model.dims().V;
  rows.resize(size_t(T * V));
  for (int64_t t = 0; t < T; ++t) {
    const R* l = s.logits.data() + t * V;
    const double z = log_sum_exp(l, V);
    for (int64_t v = 0; v < V; ++v) rows[size_t(t * V + v)] = double(l[v]) - z;
  }
}

template <typename R>
double reverse_kl_backward_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, const double* teacher_logq,
                             const uint8_t* mask, double scale, R* grads, TrainScratchT<R>& s) {
  forward_rows(model, tokens, T, s, true);
  const int64_t V = model.dims().V;
  std::vector<double> logp(static_cast<size_t>(V));
  double total = 0;
  for (int64_t t = 0; t < T; ++t) {
    R* l = s.logits.data() + t * V;
    if (!mask[t]) {
      std::fill(l, l + V, R(0));
      continue;
    }
    const double z = log_sum_exp(l, V);
    const double* lq = teacher_logq + t * V;
    double kl = 0;
    for (int64_t v = 0; v < V; ++v) {
      logp[size_t(v)] = double(l[v]) - z;
      kl += std::exp(logp[size_t(v)]) * (logp[size_t(v)] - lq[v]);
    }
    total += kl;
    // dKL/dl_v = p_v (d_v - KL), d_v = log p_v - log q_v (sum_v p_v d_v = KL).
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(logp[size_t(v)]);
      l[v] = R(scale * p * (logp[size_t(v)] - lq[v] - kl));
    }
  }
  model.backward(grads, s.logits.data(), tokens, s.rec, s.bwd, s.fwd.layer);
  return total;
}

#define K3_TOKEN_GRAD(R)                                                                                          \
  template void sequence_logprobs_t<R>(const K3ModelT<R>&, const int32_t*, int64_t, TrainScratchT<R>&, double*,  \
                                       const EmbedSpliceT<R>*);                                                   \
  template double token_objective_backward_t<R>(const K3ModelT<R>&, const int32_t*, int64_t, const TokenObjective&, \
                                                R*, TrainScratchT<R>&, double*, const EmbedSpliceT<R>*);          \
  template void sequence_log_softmax_t<R>(const K3ModelT<R>&, const int32_t*, int64_t, TrainScratchT<R>&,        \
                                          std::vector<double>&);                                                  \
  template double reverse_kl_backward_t<R>(const K3ModelT<R>&, const int32_t*, int64_t, const double*,           \
                                           const uint8_t*, double, R*, TrainScratchT<R>&);
K3_TOKEN_GRAD(float)
K3_TOKEN_GRAD(double)

}  // namespace k3
