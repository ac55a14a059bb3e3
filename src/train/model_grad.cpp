// One sequence's loss and gradient (see model_grad.h): forward with record, cross-entropy
// over the next-token targets, the auxiliary balance loss per MoE layer, and the backward.
#include "train/model_grad.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/grow.h"
#include "kernels/log_sum_exp.h"
#include "kernels/router.h"

namespace k3 {

namespace {

// Targets are tokens[1, T]; the inputs are checked by the forward.
void check_targets(const int32_t* tokens, int64_t T, int64_t V) {
  for (int64_t t = 1; t <= T; ++t)
    if (tokens[t] < 0 || tokens[t] >= V)
      fail("token id " + std::to_string(tokens[t]) + " at position " + std::to_string(t) +
           " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

// The forward of one fresh sequence: logits [T, V] into s.logits, activations into s.rec
// when `record`.
template <typename R>
void run_forward(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s, bool record,
                 KDAPath kda_path, const EmbedSpliceT<R>* splice) {
  const ModelDims& dm = model.dims();
  K3_ASSERT(T >= 1, "forward_backward: a sequence needs at least one target");
  check_targets(tokens, T, dm.V);
  grow(s.logits, T * dm.V);
  s.st.reset(dm);
  ForwardOptions fo;
  fo.mode = MixerMode::Prefill;
  fo.kda_path = kda_path;
  model.forward(s.logits.data(), tokens, T, s.st, s.fwd, fo, record ? &s.rec : nullptr, splice);
}

// Summed cross-entropy of logits [T, V] against targets [T]:
//   loss_t = logsumexp(l_t) - l_t[y_t];  with dlogits: l_t <- scale (softmax(l_t) - onehot(y_t))
// Rows are independent (parallel); their losses are summed in order (deterministic).
template <typename R>
double cross_entropy(R* logits, const int32_t* targets, int64_t T, int64_t V, double scale, bool dlogits,
                     std::vector<double>& row_loss, const uint8_t* mask = nullptr, const float* weight = nullptr) {
  grow(row_loss, T);
#pragma omp parallel for schedule(static) if (T * V > 65536)
  for (int64_t t = 0; t < T; ++t) {
    R* l = logits + t * V;
    if (mask && !mask[t]) {  // not scored: no loss, no gradient
      row_loss[size_t(t)] = 0;
      if (dlogits) std::fill(l, l + V, R(0));
      continue;
    }
    const double lse = log_sum_exp(l, V);
    const double w = weight ? double(weight[t]) : 1.0;
    row_loss[size_t(t)] = w * (lse - double(l[targets[t]]));
    if (dlogits) {
      const R sh = R(lse), sc = R(scale * w);
      for (int64_t v = 0; v < V; ++v) l[v] = sc * std::exp(l[v] - sh);
      l[targets[t]] -= sc;
    }
  }
  double sum = 0;
  for (int64_t t = 0; t < T; ++t) sum += row_loss[size_t(t)];
  return sum;
}

// The aux loss of every MoE layer from the record; with `grads`, each layer's d/dscores
// (times scale) into s.dscores and the per-layer pointer list s.dscores_ptr.
template <typename R>
double aux_losses(const K3ModelT<R>& model, TrainScratchT<R>& s, int64_t T, double alpha, double scale,
                  bool grads) {
  const ModelDims& dm = model.dims();
  const int64_t E = dm.moe.E, k = dm.moe.k;
  s.dscores.resize(size_t(dm.L));
  s.dscores_ptr.assign(size_t(dm.L), nullptr);
  double total = 0;
  for (int64_t i = 0; i < dm.L; ++i) {
    if (!model.layer(i).is_moe) continue;
    const MoERoutingT<R>& r = s.rec.layers[size_t(i)].moe.routing;
    R* ds = nullptr;
    if (grads) {
      grow(s.dscores[size_t(i)], T * E);
      ds = s.dscores[size_t(i)].data();
    }
    total += router_aux_loss<R>(ds, r.idx.data(), r.scores.data(), T, E, k, alpha);
    if (grads) {
      for (int64_t j = 0; j < T * E; ++j) ds[j] *= R(scale);
      s.dscores_ptr[size_t(i)] = ds;
    }
  }
  return total;
}

// Copies each MoE layer's routing (and the bias in force) out for balancing statistics.
template <typename R>
void export_routing(SequenceRouting& out, const K3ModelT<R>& model, const TrainScratchT<R>& s, int64_t T) {
  const ModelDims& dm = model.dims();
  const int64_t E = dm.moe.E;
  int64_t n_moe = 0;
  for (int64_t i = 0; i < dm.L; ++i) n_moe += model.layer(i).is_moe ? 1 : 0;
  out.scores.resize(size_t(n_moe));
  out.bias.resize(size_t(n_moe));
  out.topk.resize(size_t(n_moe));
  out.T = T;
  int64_t m = 0;
  for (int64_t i = 0; i < dm.L; ++i) {
    const LayerWeightsT<R>& w = model.layer(i);
    if (!w.is_moe) continue;
    const MoERoutingT<R>& r = s.rec.layers[size_t(i)].moe.routing;
    out.scores[size_t(m)].assign(r.scores.begin(), r.scores.begin() + T * E);
    if (w.moe.router_bias) out.bias[size_t(m)].assign(w.moe.router_bias, w.moe.router_bias + E);
    else out.bias[size_t(m)].assign(size_t(E), 0.f);
    out.topk[size_t(m)].assign(r.idx.begin(), r.idx.begin() + T * dm.moe.k);
    ++m;
  }
}

int64_t scored_targets(const LossOptions& opt, int64_t T) {
  if (!opt.target_mask) return T;
  int64_t n = 0;
  for (int64_t t = 0; t < T; ++t) n += opt.target_mask[t] ? 1 : 0;
  return n;
}

}  // namespace

template <typename R>
SequenceResult forward_backward_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, double grad_scale,
                                  R* grads, TrainScratchT<R>& s, const LossOptions& opt,
                                  SequenceRouting* routing_out, KDAPath kda_path, const EmbedSpliceT<R>* splice,
                                  const GradRangeDone* done) {
  const ModelDims& dm = model.dims();
  if (model.weights().expert_storage() != ExpertStorage::Plain)
    fail("training needs f32 routed experts, but the model holds them as MXFP4 (load the checkpoint with "
         "dequantize_experts)");
  run_forward(model, tokens, T, s, /*record=*/true, kda_path, splice);
  SequenceResult res;
  res.n_targets = scored_targets(opt, T);
  // loss = sum_t CE_t (+ aux); the logits buffer becomes grad_scale * dloss/dlogits.
  res.loss_sum = cross_entropy(s.logits.data(), tokens + 1, T, dm.V, grad_scale, /*dlogits=*/true, s.row_loss,
                               opt.target_mask, opt.target_weight);
  const R* const* dscores = nullptr;
  if (opt.aux_alpha != 0.0) {
    // T * aux: the aux loss is a per-sequence mean, so it weighs like the mean CE (with the
    // trainer's grad_scale = 1 / targets the objective is mean CE + mean over sequences of aux).
    res.aux_loss = aux_losses(model, s, T, opt.aux_alpha, grad_scale * double(T), /*grads=*/true);
    dscores = s.dscores_ptr.data();
  }
  if (routing_out) export_routing(*routing_out, model, s, T);
  model.backward(grads, s.logits.data(), tokens, s.rec, s.bwd, s.fwd.layer, dscores, splice, done);
  return res;
}

template <typename R>
SequenceResult forward_loss_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s,
                              const LossOptions& opt, KDAPath kda_path, const EmbedSpliceT<R>* splice) {
  const bool aux = opt.aux_alpha != 0.0;  // the aux loss reads the routing from the record
  run_forward(model, tokens, T, s, aux, kda_path, splice);
  SequenceResult res;
  res.n_targets = scored_targets(opt, T);
  res.loss_sum = cross_entropy(s.logits.data(), tokens + 1, T, model.dims().V, 1.0, false, s.row_loss, opt.target_mask, opt.target_weight);
  if (aux) res.aux_loss = aux_losses(model, s, T, opt.aux_alpha, 1.0, false);
  return res;
}

SequenceResult forward_backward(const K3Model& model, const int32_t* tokens, int64_t T, double grad_scale,
                                float* grads, TrainScratch& s, const LossOptions& opt, SequenceRouting* routing_out,
                                const GradRangeDone* done) {
  return forward_backward_t<float>(model, tokens, T, grad_scale, grads, s, opt, routing_out, KDAPath::Fast, nullptr, done);
}

double eval_loss_sum(const K3Model& model, const int32_t* tokens, int64_t T, TrainScratch& s) {
  return forward_loss_t<float>(model, tokens, T, s, LossOptions{}, KDAPath::Fast).loss_sum;
}

std::unique_ptr<TrainScratch> make_train_scratch() { return std::make_unique<TrainScratch>(); }

template SequenceResult forward_backward_t<float>(const K3ModelT<float>&, const int32_t*, int64_t, double, float*,
                                                  TrainScratchT<float>&, const LossOptions&, SequenceRouting*,
                                                  KDAPath, const EmbedSpliceT<float>*, const GradRangeDone*);
template SequenceResult forward_backward_t<double>(const K3ModelT<double>&, const int32_t*, int64_t, double,
                                                   double*, TrainScratchT<double>&, const LossOptions&,
                                                   SequenceRouting*, KDAPath, const EmbedSpliceT<double>*,
                                                   const GradRangeDone*);
template SequenceResult forward_loss_t<float>(const K3ModelT<float>&, const int32_t*, int64_t, TrainScratchT<float>&,
                                              const LossOptions&, KDAPath, const EmbedSpliceT<float>*);
template SequenceResult forward_loss_t<double>(const K3ModelT<double>&, const int32_t*, int64_t,
                                               TrainScratchT<double>&, const LossOptions&, KDAPath,
                                               const EmbedSpliceT<double>*);

}  // namespace k3
