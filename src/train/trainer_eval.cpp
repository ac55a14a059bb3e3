// Held-out evaluation of a training run (see trainer.h EvalResult): non-overlapping windows of
// seq_len + 1 tokens from the start of the held-out stream, their mean cross-entropy, bits per
// byte and MaxVio per MoE layer; windows in parallel over threads and split over data-parallel
// ranks, summed in window order as one process sums them.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/log_sum_exp.h"
#include "train/trainer_impl.h"

namespace k3 {

using trainer_detail::for_each_sequence;

EvalResult Trainer::Impl::evaluate(int64_t T, int64_t max_tokens) {
  // Expert parallel: every rank evaluates its windows with every expert, gathered for the
  // evaluation and given back after it.
  sync_expert_weights();
  struct Release {
    Impl* m;
    ~Release() { m->release_foreign_experts(); }
  } release{this};
  const int64_t avail = T > 0 ? (int64_t(data.heldout.size()) - 1) / T : 0;
  if (avail < 1)
    fail("evaluate: the held-out stream (" + std::to_string(data.heldout.size()) + " tokens) holds no window of " +
         std::to_string(T) + " + 1 tokens");
  const int64_t n = max_tokens > 0 ? std::min(avail, (max_tokens + T - 1) / T) : avail;
  while (int64_t(eval_scratch.size()) < P) eval_scratch.push_back(std::make_unique<EvalScratch>());
  const int64_t V = model->dims().V;
  std::vector<double> nats(size_t(n), 0.0);
  std::vector<int64_t> bytes(size_t(n), 0);
  std::vector<std::vector<int64_t>> loads(size_t(P), std::vector<int64_t>(size_t(n_moe * E), 0));
  // Data parallel: rank `rank` evaluates windows [w0, w1); the per-window figures are gathered, so
  // the totals are summed in window order as one process sums them.
  const int64_t w0 = n * rank / n_ranks, w1 = n * (rank + 1) / n_ranks;
  for_each_sequence(w1 - w0, P, P > 1 && w1 - w0 > 1, [&](int64_t i, int tid) {
    const int64_t w = w0 + i;
    EvalScratch& es = *eval_scratch[size_t(tid)];
    const int32_t* ids = data.heldout.data() + w * T;
    es.ds.reset(model->dims());
    es.logits.resize(size_t(T * V));
    model->forward(es.logits.data(), ids, T, es.ds, es.fs, {}, &es.rec);
    double sum = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = es.logits.data() + t * V;
      sum += log_sum_exp(row, V) - double(row[ids[t + 1]]);
    }
    nats[size_t(w)] = sum;
    bytes[size_t(w)] = target_bytes(ids, T, vocab.token_bytes());
    for (int64_t l = 0; l < n_moe; ++l)
      count_loads(loads[size_t(tid)].data() + l * E, es.rec.layers[size_t(first_moe + l)].moe.routing.idx.data(), T, topk, E);
  });
  if (dp) {
    std::vector<double> mine(nats.begin() + w0, nats.begin() + w1);
    nats = dp->allgatherv(mine.data(), mine.size(), "eval.gather");
    std::vector<int64_t> mb(bytes.begin() + w0, bytes.begin() + w1);
    bytes = dp->allgatherv(mb.data(), mb.size(), "eval.gather");
    for (int t = 1; t < P; ++t)
      for (size_t j = 0; j < loads[0].size(); ++j) loads[0][j] += loads[size_t(t)][j];
    for (int t = 1; t < P; ++t) std::fill(loads[size_t(t)].begin(), loads[size_t(t)].end(), 0);
    dp->allreduce_sum_i64(loads[0].data(), int64_t(loads[0].size()), "eval.loads");
  }
  EvalResult r;
  const HeldoutTotals h = heldout_totals(nats, bytes, T);
  r.targets = h.targets, r.bytes = h.bytes, r.loss = h.loss, r.bpb = h.bpb;
  for (int64_t l = 0; l < n_moe; ++l) {
    std::vector<int64_t> sum(size_t(E), 0);
    for (int t = 0; t < P; ++t)
      for (int64_t j = 0; j < E; ++j) sum[size_t(j)] += loads[size_t(t)][size_t(l * E + j)];
    r.maxvio.push_back(max_violation(sum.data(), E));
  }
  return r;
}

}  // namespace k3
