// Expert load balancing for the MoE router (docs/model.md section 6). The router selects
// top_k(s + b) with the correction bias b (`e_score_correction_bias`), which never gets a
// gradient; a balancer updates b between optimizer steps from the routing it observed:
//  - QuantileBalancer (Quantile Balancing, Su, kexue.fm 11619/11626/11760): cutoff
//    alpha_i = (k+1)-th largest of s_i + b, margins r_ij = s_ij - alpha_i, next bias
//    b_j = -quantile_{1-k/E}(r_{:,j}), then b -= mean(b). Over the global batch (every
//    micro-batch of the step), applied from the next step. Exact (stores margins) or
//    histogram-estimated (per-expert bin counts, additive across micro-batches and ranks;
//    K3: 1000 uniform bins over [min(b) - 1, max(b) + 1] for the negated margins).
//  - SignBalancer (DeepSeek loss-free, arXiv 2408.15664): b_j += u * sign(mean_load - load_j).
// Loads and MaxVio = (max_j load_j - mean load) / mean load are tracked per layer and step.
// The Switch-style auxiliary loss is a loss term, not a bias update: see aux_loss.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace k3 {

class DataParallel;  // train/parallel.h

double max_violation(const int64_t* loads, int64_t E);  // MaxVio of one load vector

// Counts of tokens per expert from a routing (topk_idx [m, k]).
void count_loads(int64_t* loads, const int32_t* topk_idx, int64_t m, int64_t k, int64_t E);

class Balancer {
 public:
  virtual ~Balancer() = default;
  // One routed micro-batch of layer `layer`: sigmoid scores s [m, E] (unbiased), the bias b
  // in force [E] (what the router selected with) and the selection topk_idx [m, k].
  virtual void observe(int64_t layer, const float* scores, const float* bias, const int32_t* topk_idx, int64_t m) = 0;
  // End of an optimizer step: writes each layer's next bias into biases[layer] (length E)
  // and resets the step's statistics. Returns nothing; loads are kept for reporting.
  virtual void update(const std::vector<float*>& biases) = 0;
  virtual std::string name() const = 0;
  // Data parallel: makes the step's statistics those of the global batch (every rank's
  // observations), exactly, before update(): loads and histogram counts are integers and are
  // summed; the exact quantile's margins are gathered (a quantile depends on the set of
  // values, not on their order). Collective over dp; every rank then computes the same bias.
  virtual void reduce_across(DataParallel& dp);
  // Serialisable state beyond the biases themselves (none for the bias-only balancers).
  // Per-layer loads of the last completed step (for metrics).
  const std::vector<std::vector<int64_t>>& last_loads() const { return last_loads_; }

 protected:
  Balancer(int64_t layers, int64_t E, int64_t k);
  void accumulate_loads(int64_t layer, const int32_t* topk_idx, int64_t m);
  void finish_step();
  int64_t layers_, E_, k_;
  std::vector<std::vector<int64_t>> loads_, last_loads_;
};

struct QuantileBalancerOptions {
  bool exact = false;   // true: exact quantile over stored margins; false: histogram
  int64_t bins = 1000;  // histogram bins
};

class QuantileBalancer : public Balancer {
 public:
  QuantileBalancer(int64_t layers, int64_t E, int64_t k, QuantileBalancerOptions opt);
  void observe(int64_t layer, const float* scores, const float* bias, const int32_t* topk_idx, int64_t m) override;
  void update(const std::vector<float*>& biases) override;
  std::string name() const override { return opt_.exact ? "qb-exact" : "qb-hist"; }
  void reduce_across(DataParallel& dp) override;

  // The quantile of the negated margins of expert j in `layer` (exposed for tests):
  // b_j before centring is -quantile_{1-k/E}(r_{:,j}) = quantile_{k/E}(-r_{:,j}).
  double next_bias_uncentred(int64_t layer, int64_t j) const;
  // Histogram access for additive reduction across ranks (counts are plain integers).
  std::vector<int64_t>& histogram(int64_t layer) { return hist_[layer]; }

 private:
  void ensure_range(int64_t layer, const float* bias);
  QuantileBalancerOptions opt_;
  std::vector<std::vector<std::vector<float>>> per_expert_;  // exact: [layer][j] -> values
  std::vector<std::vector<int64_t>> hist_;      // histogram: [layer][j * bins + bin]
  std::vector<double> lo_, hi_;                 // histogram range per layer (fixed within a step)
  std::vector<int64_t> count_;                  // tokens observed per layer this step
};

class SignBalancer : public Balancer {
 public:
  SignBalancer(int64_t layers, int64_t E, int64_t k, double u = 1e-3);
  void observe(int64_t layer, const float* scores, const float* bias, const int32_t* topk_idx, int64_t m) override;
  void update(const std::vector<float*>& biases) override;
  std::string name() const override { return "sign"; }

 private:
  double u_;
};

// No bias updates; still tracks loads (also used with the auxiliary loss).
class NoBalancer : public Balancer {
 public:
  NoBalancer(int64_t layers, int64_t E, int64_t k, std::string label = "none") : Balancer(layers, E, k), label_(std::move(label)) {}
  void observe(int64_t layer, const float*, const float*, const int32_t* topk_idx, int64_t m) override {
    accumulate_loads(layer, topk_idx, m);
  }
  void update(const std::vector<float*>&) override { finish_step(); }
  std::string name() const override { return label_; }

 private:
  std::string label_;
};

}  // namespace k3
