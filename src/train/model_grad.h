// The model-level training step of one sequence: forward with saved activations, summed
// cross-entropy over the T next-token targets, optional Switch-style auxiliary balance loss
// per MoE layer (kernels/router.h router_aux_loss, docs/model.md section 6), and the whole
// backward (K3ModelT::backward) accumulating grad_scale * d(loss)/dW into a buffer carved
// like the weights. The trainer calls forward_backward / eval_loss_sum (float); the _t
// templates are the same code for any scalar type (double: the gradient checks).
//
// Performance contract: a TrainScratch keeps every buffer (forward scratch, record, backward
// scratch, logits), so steady-state calls of one shape do not allocate; KDA runs the fast
// chunked core (float, per-chunk states saved for the backward), MoE the grouped path,
// projections BLAS. Thread-safe for distinct TrainScratch and grads on one const model: the
// trainer runs one sequence per thread (with BLAS/OpenMP inside single-threaded).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/k3_model.h"

namespace k3 {

struct LossOptions {
  double aux_alpha = 0.0;  // Switch-style aux loss coefficient (0: off)
  // [T] (optional): 0 = target t is not scored (no loss, no gradient): the positions that
  // predict an image token or a prompt; n_targets then counts the scored ones.
  const uint8_t* target_mask = nullptr;
  // [T] (optional): target t's cross-entropy counts w_t times in the loss and its gradient
  // (loss_sum = sum_t w_t CE_t): the answer tokens of a long-range task, which a predictable
  // filler would otherwise outnumber 50 to 1 (train/long_mix.h answer_weight).
  const float* target_weight = nullptr;
};

struct SequenceResult {
  double loss_sum = 0;    // summed cross-entropy over the targets (nats)
  int64_t n_targets = 0;  // T
  double aux_loss = 0;    // sum over MoE layers of router_aux_loss (0 when aux_alpha = 0)
};

// Each MoE layer's routing of one sequence: index m = ordinal among MoE layers (0 .. n_moe-1);
// scores[m] [T, E] unbiased sigmoid scores, bias[m] [E] the bias in force, topk[m] [T, k].
// k3::Balancer (src/train/balancer.h) has exactly this observe() signature per layer.
struct SequenceRouting {
  std::vector<std::vector<float>> scores, bias;
  std::vector<std::vector<int32_t>> topk;
  int64_t T = 0;
};

// Per-thread reusable buffers (grow only).
template <typename R>
struct TrainScratchT {
  DecodeStateT<R> st;                   // fresh per sequence
  ForwardScratchT<R> fwd;
  ForwardRecordT<R> rec;                // saved activations
  BackwardScratchT<R> bwd;
  std::vector<R> logits;                // [T, V]; the backward overwrites it with dlogits
  std::vector<double> row_loss;         // [T] per-target loss (summed in order: deterministic)
  std::vector<std::vector<R>> dscores;  // [L] aux-loss score gradients [T, E] (MoE layers)
  std::vector<const R*> dscores_ptr;    // [L]
};
struct TrainScratch : TrainScratchT<float> {};

// tokens [T + 1]: inputs tokens[0, T), targets tokens[1, T]. Cross-entropy summed over the T
// targets (nats). Adds grad_scale * d(loss_sum + T * aux)/dW (T * aux: the aux loss, a mean
// over the sequence's tokens, then weighs like the mean cross-entropy once the trainer scales
// by 1 / targets; before 2026-12-01 it was loss_sum + aux, an aux weight of alpha / T) into
// `grads` (a buffer carved exactly
// like model.weights(): same ParamLayout, Plain experts; parameter gradients accumulate).
// The router bias (e_score_correction_bias) never gets a gradient.
// routing_out (optional): per MoE layer the routing of this sequence (scores, bias copy, topk),
// so the caller can feed a Balancer in a deterministic order after a parallel loop.
// A token id outside [0, V) is a k3::Error naming its position; so is a model whose routed
// experts are MXFP4 (load checkpoints for training with LoadOptions::dequantize_experts).
// done (optional): told by the backward each range of `grads` it has finished (k3_model.h
// GradRangeDone): data parallelism reduces a range while the backward goes on.
SequenceResult forward_backward(const K3Model& model, const int32_t* tokens, int64_t T, double grad_scale,
                                float* grads, TrainScratch& s, const LossOptions& opt, SequenceRouting* routing_out,
                                const GradRangeDone* done = nullptr);
// Held-out loss of one sequence (no gradient): summed cross-entropy over T targets (nats).
double eval_loss_sum(const K3Model& model, const int32_t* tokens, int64_t T, TrainScratch& s);
std::unique_ptr<TrainScratch> make_train_scratch();

// splice (optional): image tokens replacing the expanded media placeholders (k3_model.h); the
// backward writes their gradient to splice->drows for the vision encoder's backward.
// The same for any scalar type (forward_backward is forward_backward_t<float>). kda_path: the
// KDA core of the forward (Fast: the fast chunked kernel in float, the chunked reference in
// double).
template <typename R>
SequenceResult forward_backward_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, double grad_scale,
                                  R* grads, TrainScratchT<R>& s, const LossOptions& opt,
                                  SequenceRouting* routing_out = nullptr, KDAPath kda_path = KDAPath::Fast,
                                  const EmbedSpliceT<R>* splice = nullptr, const GradRangeDone* done = nullptr);
// loss_sum and (when opt.aux_alpha > 0) aux_loss of one sequence, no gradient: the function
// forward_backward_t differentiates (finite-difference checks).
template <typename R>
SequenceResult forward_loss_t(const K3ModelT<R>& model, const int32_t* tokens, int64_t T, TrainScratchT<R>& s,
                              const LossOptions& opt, KDAPath kda_path = KDAPath::Fast,
                              const EmbedSpliceT<R>* splice = nullptr);

}  // namespace k3
