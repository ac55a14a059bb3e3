// Expert parallelism in a training run (see trainer.h TrainOptions::ep): where the owner's
// summed expert gradients go, and the other ranks' experts gathered for evaluation and
// checkpoints and given back afterwards.
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"
#include "model/param_specs.h"
#include "train/trainer_impl.h"

namespace k3 {

// Expert parallel: every rank's copy (root < 0) or root's of every routed expert set to its
// owner's (group 0), so a rank can evaluate, hash and write the whole model (the training
// steps use only its own). A few MiB of experts at a time, so nothing but the weight buffer
// grows by the whole experts.
void Trainer::Impl::sync_expert_weights(int root) {
  if (!ep || ep->size() == 1) return;
  const std::vector<ParamRef>& refs = all_refs;
  std::vector<size_t> ex;  // the routed experts' parameters, in order
  for (size_t i = 0; i < refs.size(); ++i)
    if (shard.owner[i] >= 0) ex.push_back(i);
  const int64_t chunk_floats = int64_t(4) << 20;
  std::vector<float> mine;
  for (size_t a = 0; a < ex.size();) {
    size_t b = a;
    int64_t n = 0;
    while (b < ex.size() && (b == a || n + refs[ex[b]].rows * refs[ex[b]].cols <= chunk_floats))
      n += refs[ex[b]].rows * refs[ex[b]].cols, ++b;
    mine.clear();
    for (size_t k = a; k < b; ++k)
      if (shard.holder[ex[k]] == rank) mine.insert(mine.end(), refs[ex[k]].w, refs[ex[k]].w + refs[ex[k]].rows * refs[ex[k]].cols);
    std::vector<size_t> counts;
    const std::vector<float> all = root < 0 ? dp->allgatherv(mine.data(), mine.size(), "ep.weights.gather", &counts)
                                            : dp->gatherv(mine.data(), mine.size(), root, "ep.weights.gather", &counts);
    if (root < 0 || root == rank) {
      std::vector<size_t> cursor(counts.size(), 0);
      for (size_t r = 1; r < counts.size(); ++r) cursor[r] = cursor[r - 1] + counts[r - 1];
      for (size_t k = a; k < b; ++k) {
        const ParamRef& p = refs[ex[k]];
        const size_t c = size_t(p.rows * p.cols);
        size_t& at = cursor[size_t(shard.holder[ex[k]])];
        if (shard.owner[ex[k]] != ep->rank()) std::memcpy(p.w, all.data() + at, sizeof(float) * c);
        at += c;
      }
    }
    a = b;
  }
}

// Expert parallel: the other ranks' experts' pages of the weight buffer back to the system
// (they read as zeros until the next gather); the gradient buffer's were never written.
void Trainer::Impl::release_foreign_experts() {
  float* w = model->weights().data();
  for (const auto& [b, e] : foreign_runs) release_pages(w + b, sizeof(float) * size_t(e - b));
}

int64_t Trainer::Impl::foreign_resident() const {
  int64_t n = 0;
  const float* w = model->weights().data();
  const float* g = grads[0].data<float>();
  for (const auto& [b, e] : foreign_runs)
    n += resident_bytes(w + b, sizeof(float) * size_t(e - b)) + resident_bytes(g + b, sizeof(float) * size_t(e - b));
  return n;
}

// Expert parallel: where the owner's summed expert gradients go (grads[0], the optimiser's).
void Trainer::Impl::setup_expert_parallel(const K3Config& cfg) {
  const int64_t per = E / ep->size();
  std::vector<std::vector<ExpertGrad>> owned(static_cast<size_t>(n_moe));
  float* g0 = grads[0].data<float>();
  const WeightStore& w = model->weights();
  auto grad_of = [&](const std::string& name) { return g0 + (w.param(name) - w.data()); };
  K3_ASSERT(n_moe > 0, "train: --ep needs a model with MoE layers");
  for (int64_t l = 0; l < n_moe; ++l)
    for (int64_t j = 0; j < per; ++j) {
      const std::string x = layer_prefix(first_moe + l) + "block_sparse_moe.experts." + std::to_string(ep->rank() * per + j) + ".";
      owned[size_t(l)].push_back({grad_of(x + "w1.weight"), grad_of(x + "w3.weight"), grad_of(x + "w2.weight")});
    }
  (void)cfg;
  ep->bind_gradients(owned, model->dims().moe.l, model->dims().moe.F);
}

}  // namespace k3
