#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/gemm.h"

namespace k3 {

Optimizer::Optimizer(std::vector<ParamRef> params, OptimizerOptions opt) : params_(std::move(params)), opt_(opt) {
  int64_t maxblock = 0;
  for (auto& p : params_) {
    K3_ASSERT(p.w && p.g && p.rows > 0 && p.cols > 0, p.name);
    if (p.kind == OptKind::Muon) {
      K3_ASSERT(p.heads >= 1 && p.rows % p.heads == 0, p.name + ": rows not divisible by heads");
      const int64_t r = p.rows / p.heads, c = p.cols, m = std::min(r, c);
      maxblock = std::max(maxblock, 3 * m * m + 3 * r * c);
    }
    offset_.push_back(total_);
    total_ += p.rows * p.cols;
  }
  state_.assign(size_t(2 * total_), 0.0f);
  scratch_.assign(size_t(std::max<int64_t>(maxblock, 1)), 0.0f);
}

void newton_schulz5(float* X, int64_t rows, int64_t cols, int steps, float* scratch) {
  // Work on the wide orientation (r <= c) so the Gram matrix is the small one.
  const bool tr = rows > cols;
  const int64_t r = tr ? cols : rows, c = tr ? rows : cols;
  float* Y = scratch;               // [r, c]
  float* A = Y + r * c;             // [r, r]
  float* B = A + r * r;             // [r, r]
  float* AA = B + r * r;            // [r, r]
  float* Z = AA + r * r;            // [r, c]
  double ss = 0;
  for (int64_t i = 0; i < rows * cols; ++i) ss += double(X[i]) * X[i];
  const float inv = float(1.0 / (std::sqrt(ss) + 1e-7));
  if (tr) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) Y[j * c + i] = X[i * cols + j] * inv;
  } else {
    for (int64_t i = 0; i < rows * cols; ++i) Y[i] = X[i] * inv;
  }
  const float a = 3.4445f, b = -4.7750f, cc = 2.0315f;
  for (int s = 0; s < steps; ++s) {
    gemm(false, true, r, r, c, 1.0f, Y, c, Y, c, 0.0f, A, r);    // A = Y Y^T
    gemm(false, false, r, r, r, 1.0f, A, r, A, r, 0.0f, AA, r);  // AA = A A
    for (int64_t i = 0; i < r * r; ++i) B[i] = b * A[i] + cc * AA[i];
    gemm(false, false, r, c, r, 1.0f, B, r, Y, c, 0.0f, Z, c);   // Z = B Y
    for (int64_t i = 0; i < r * c; ++i) Y[i] = a * Y[i] + Z[i];
  }
  if (tr) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) X[i * cols + j] = Y[j * c + i];
  } else {
    for (int64_t i = 0; i < rows * cols; ++i) X[i] = Y[i];
  }
}

void Optimizer::step(double lr) {
  ++t_;
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(t_)), bc2 = 1.0 - std::pow(b2, double(t_));
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    ParamRef& p = params_[pi];
    const int64_t n = p.rows * p.cols;
    float* m = state_.data() + 2 * offset_[pi];
    float* v = m + n;
    const float wd = p.decay ? float(1.0 - lr * opt_.weight_decay) : 1.0f;
    if (p.kind == OptKind::AdamW) {
      const float a = float(lr / bc1), rb2 = float(1.0 / std::sqrt(bc2));
      for (int64_t i = 0; i < n; ++i) {
        const float g = p.g[i];
        m[i] = float(b1) * m[i] + float(1 - b1) * g;
        v[i] = float(b2) * v[i] + float(1 - b2) * g * g;
        p.w[i] = p.w[i] * wd - a * m[i] / (std::sqrt(v[i]) * rb2 + float(opt_.eps));
      }
    } else {
      // Muon: momentum buffer in m; the orthogonalised update is built in v (scratch use
      // of the second state slot keeps one allocation).
      const float mu = float(opt_.muon_momentum);
      for (int64_t i = 0; i < n; ++i) {
        m[i] = mu * m[i] + p.g[i];
        v[i] = opt_.muon_nesterov ? p.g[i] + mu * m[i] : m[i];
      }
      const int64_t r = p.rows / p.heads, c = p.cols;
      const float scale = float(lr * 0.2 * std::sqrt(double(std::max(r, c))));
      for (int64_t h = 0; h < p.heads; ++h) {
        float* U = v + h * r * c;
        newton_schulz5(U, r, c, opt_.muon_ns_steps, scratch_.data());
        float* W = p.w + h * r * c;
        for (int64_t i = 0; i < r * c; ++i) W[i] = W[i] * wd - scale * U[i];
      }
    }
  }
}

std::vector<double> param_sq_norms(const std::vector<ParamRef>& params) {
  std::vector<double> out(params.size(), 0.0);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    double ss = 0;
    for (int64_t j = 0; j < p.rows * p.cols; ++j) ss += double(p.g[j]) * p.g[j];
    out[i] = ss;
  }
  return out;
}

double norm_of_sq_norms(const std::vector<double>& sq) {
  double ss = 0;
  for (double v : sq) ss += v;
  return std::sqrt(ss);
}

double global_grad_norm(const std::vector<ParamRef>& params) { return norm_of_sq_norms(param_sq_norms(params)); }

void clip_grads_to(const std::vector<ParamRef>& params, double norm, double max_norm) {
  if (max_norm > 0 && norm > max_norm) {
    const float s = float(max_norm / (norm + 1e-6));
    for (auto& p : params)
      for (int64_t i = 0; i < p.rows * p.cols; ++i) p.g[i] *= s;
  }
}

double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  clip_grads_to(params, norm, max_norm);
  return norm;
}

double wsd_lr(int64_t step, int64_t total, double peak, double end, int64_t warmup, int64_t decay) {
  if (warmup > 0 && step < warmup) return peak * double(step + 1) / double(warmup);
  const int64_t decay_start = total - decay;
  if (decay > 0 && step >= decay_start) {
    const double f = double(step - decay_start + 1) / double(decay);
    return peak + (end - peak) * std::min(1.0, f);
  }
  return peak;
}

}  // namespace k3
