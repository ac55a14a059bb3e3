// The balancer's part of a training step (see trainer_impl.h; docs/model.md section 6): each
// micro-batch's routing observed in sequence order, the statistics made those of the global
// batch across data-parallel ranks, and the router biases the next step routes with.
#include "train/trainer_impl.h"

namespace k3 {

// Per layer, sequences in order (layers are independent in the balancer); the image-text
// sequences' routing too: the balancer sees every token the step trains on.
void Trainer::Impl::observe_routing(const TrainStep& s) {
  if (!balancer) return;
#pragma omp parallel for schedule(static) num_threads(P)
  for (int64_t l = 0; l < n_moe; ++l)
    for (int64_t q = 0; q < s.nl; ++q) {
      const SequenceRouting& r = routing[size_t(q)];
      balancer->observe(l, r.scores[size_t(l)].data(), r.bias[size_t(l)].data(), r.topk[size_t(l)].data(), r.T);
    }
  if (vision)
#pragma omp parallel for schedule(static) num_threads(P)
    for (int64_t l = 0; l < n_moe; ++l)
      for (int64_t q = 0; q < s.nvis; ++q) {
        const SequenceRouting& r = vrouting[size_t(q)];
        balancer->observe(l, r.scores[size_t(l)].data(), r.bias[size_t(l)].data(), r.topk[size_t(l)].data(), r.T);
      }
}

// Data parallel: the step's loads and histograms (or margins) of every rank, exactly.
void Trainer::Impl::reduce_routing_statistics() {
  if (dp && balancer) balancer->reduce_across(*dp);
}

// QB and the sign update: the new biases route the next step (a batch is never routed with a
// bias derived from itself); the ranks must agree on them to the bit.
void Trainer::Impl::update_balancer() {
  if (balancer) balancer->update(biases);
  if (dp && balancer) {
    std::vector<float> all_bias;
    for (float* b : biases) all_bias.insert(all_bias.end(), b, b + E);
    dp->check_identical(all_bias.data(), all_bias.size() * sizeof(float), "router biases (e_score_correction_bias)");
  }
}

// MaxVio per MoE layer of the last step's routing (empty without a balancer).
std::vector<double> Trainer::Impl::step_maxvio() const {
  std::vector<double> mv;
  if (!balancer) return mv;
  for (auto& l : balancer->last_loads()) mv.push_back(max_violation(l.data(), E));
  return mv;
}

}  // namespace k3
