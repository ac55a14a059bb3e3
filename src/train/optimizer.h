// Optimisers over a list of parameter tensors (views into the model's one parameter buffer
// and its one gradient buffer):
//  - AdamW: decoupled weight decay, bias correction (Loshchilov & Hutter).
//  - Muon: momentum, then Newton-Schulz orthogonalisation (5 quintic iterations, Keller
//    Jordan's coefficients) of each update matrix, scaled by 0.2 sqrt(max(rows, cols)) so its
//    RMS matches AdamW's (Moonlight, arXiv 2502.16982), decoupled weight decay. K3 applies it
//    per attention head to the q/k/v projections (docs/model.md section 7): a [H*D, in]
//    projection is H separate [D, in] matrices. Embeddings, lm_head, norms, gates' vectors,
//    biases and other 1-D parameters use AdamW.
// Optimiser state lives in one allocation (two floats per parameter element) so a training
// checkpoint saves it as one tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

enum class OptKind { AdamW, Muon };

struct ParamRef {
  std::string name;
  float* w = nullptr;      // parameter
  float* g = nullptr;      // gradient (same layout)
  int64_t rows = 1, cols = 1;  // 2-D view (1-D params: rows = 1)
  OptKind kind = OptKind::AdamW;
  int64_t heads = 1;       // Muon: orthogonalise `heads` row blocks separately
  bool decay = true;       // apply weight decay
};

struct OptimizerOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int muon_ns_steps = 5;
};

class Optimizer {
 public:
  Optimizer(std::vector<ParamRef> params, OptimizerOptions opt);
  // One update with learning rate lr (both AdamW and Muon use lr; Muon's RMS matching
  // makes one lr serve both).
  void step(double lr);
  int64_t steps() const { return t_; }
  const std::vector<ParamRef>& params() const { return params_; }
  // State for checkpoints: [2 * total elements] floats + the step count.
  std::vector<float>& state() { return state_; }
  void set_steps(int64_t t) { t_ = t; }
  int64_t total_elements() const { return total_; }

 private:
  std::vector<ParamRef> params_;
  std::vector<int64_t> offset_;
  OptimizerOptions opt_;
  std::vector<float> state_;
  int64_t total_ = 0, t_ = 0;
  std::vector<float> scratch_;
};

// Newton-Schulz orthogonalisation of a rows x cols matrix (in place); approximately
// U V^T of its SVD. scratch must hold 3 * min(r,c)^2 + 2 * r * c floats.
void newton_schulz5(float* X, int64_t rows, int64_t cols, int steps, float* scratch);

// Global L2 norm of all gradients, and in-place scaling to max_norm (no-op when below).
// The norm is the square root of the per-parameter sums of squares (param_sq_norms, each a
// double accumulated in element order) added in parameter order, so a data-parallel run
// whose ranks own disjoint parameters (ZeRO-1) gathers those sums and gets the same double.
std::vector<double> param_sq_norms(const std::vector<ParamRef>& params);
double norm_of_sq_norms(const std::vector<double>& sq);
double global_grad_norm(const std::vector<ParamRef>& params);
double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm);  // returns the pre-clip norm
// The scaling of clip_grad_norm for a norm computed elsewhere (no-op when norm <= max_norm).
void clip_grads_to(const std::vector<ParamRef>& params, double norm, double max_norm);

// Warmup-stable-decay within one learning-rate segment: linear warmup from 0 to `peak`
// over `warmup` steps, constant, then decay to `end` over the last `decay` steps
// (linear). step is 0-based within the segment of `total` steps.
double wsd_lr(int64_t step, int64_t total, double peak, double end, int64_t warmup, int64_t decay);

}  // namespace k3
