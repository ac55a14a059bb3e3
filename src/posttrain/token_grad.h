// The model side of every post-training loss: one sequence's per-target log-probabilities
//   logp_t = log softmax(logits_t)[y_t],  y_t = tokens[t + 1],  t = 0 .. T-1
// and the backward of any loss L(logp) through the whole model (train/model_grad.h's
// forward with record + K3ModelT::backward). With c_t = dL/dlogp_t,
//   dL/dlogits_t = c_t (onehot(y_t) - softmax(logits_t))
// and a row with c_t = 0 is exactly zero (masked tokens: prompt, system, user and tool
// results contribute nothing). The reverse KL of distillation needs whole rows:
//   KL_t = sum_v p_t(v) (log p_t(v) - log q_t(v)),  dKL_t/dlogits_t = p_t (d_t - sum_v p_t d_t),
//   d_t = log p_t - log q_t (p the student, q the teacher).
// Templates on the scalar type: float for training, double for finite-difference tests.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "train/model_grad.h"

namespace k3 {

// logp [T] of the targets tokens[1..T] (no gradient). splice (optional): image rows in place
// of the expanded media placeholders (model/k3_model.h), as the rollout's prefill had them.
template <typename R>
void sequence_logprobs_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s,
                         double* logp, const EmbedSpliceT<R>* splice = nullptr);

// The loss's coefficients from the sequence's log-probabilities: writes dlogp [T] given
// logp [T], returns the sequence's loss contribution.
using TokenObjective = std::function<double(const double* logp, int64_t T, double* dlogp)>;

// Forward with record, f, then the backward: grads += dL/dW (parameter gradients accumulate).
// logp_out (optional) [T] receives the log-probabilities. Returns f's loss. splice (optional):
// image rows; their gradient goes to splice->drows when given (else nowhere: a frozen encoder)
// and the placeholder's embedding row gets none.
template <typename R>
double token_objective_backward_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T,
                                  const TokenObjective& f, R* grads, TrainScratchT<R>& s,
                                  double* logp_out = nullptr, const EmbedSpliceT<R>* splice = nullptr);

// Full log-softmax rows [T, V] (the teacher side of distillation; no gradient).
template <typename R>
void sequence_log_softmax_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s,
                            std::vector<double>& rows);

// scale * sum_t mask_t KL(student_t || teacher_t) (reverse KL, teacher rows log q [T, V]) and
// its gradient into grads. Returns the unscaled masked KL sum.
template <typename R>
double reverse_kl_backward_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, const double* teacher_logq,
                             const uint8_t* mask, double scale, R* grads, TrainScratchT<R>& s);

}  // namespace k3
