// Held-out loss and routing statistics (see routing_eval.h).
#include "train/routing_eval.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/log_sum_exp.h"
#include "train/balancer.h"
#include "train/data.h"

namespace k3 {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t zero_count(const int64_t* loads, int64_t E) {
  int64_t n = 0;
  for (int64_t j = 0; j < E; ++j) n += loads[j] == 0;
  return n;
}

// Per-thread buffers of the forward (grow only).
struct EvalScratch {
  ForwardScratch fs;
  ForwardRecord rec;
  DecodeState ds;
  std::vector<float> logits;
  std::vector<int64_t> loads;  // [E]
  MovingQBScratch mqb;
  std::vector<int32_t> midx;   // [T, k] moving-QB selection
  std::vector<float> zero_bias;
};

// The figures of one MoE layer from its per-window loads wl [n][n_moe][E] (layer l) and valid
// slot counts ws [n][n_moe], reduced in window order; batches of per_batch windows.
LayerRoutingStats layer_stats(const std::vector<int32_t>& wl, const std::vector<int64_t>& wslots, int64_t n,
                              int64_t n_moe, int64_t l, int64_t E, int64_t k, int64_t T, int64_t per_batch) {
  LayerRoutingStats s;
  s.loads.assign(size_t(E), 0);
  s.tokens = n * T;
  std::vector<int64_t> one(static_cast<size_t>(E)), batch(static_cast<size_t>(E), 0);
  int64_t over1 = 0, over125 = 0, batch_slots = 0;
  for (int64_t w = 0; w < n; ++w) {
    const int32_t* src = wl.data() + (w * n_moe + l) * E;
    for (int64_t j = 0; j < E; ++j) {
      one[size_t(j)] = src[j];
      s.loads[size_t(j)] += src[j];
      batch[size_t(j)] += src[j];
    }
    s.slots += wslots[size_t(w * n_moe + l)];
    const double mv = max_violation(one.data(), E);
    s.seq_maxvio_mean += mv;
    s.seq_maxvio_max = std::max(s.seq_maxvio_max, mv);
    // A batch closes after per_batch windows (a trailing partial batch is left out).
    if ((w + 1) % per_batch == 0) {
      over1 += overflow_slots(batch.data(), E, 1.0);
      over125 += overflow_slots(batch.data(), E, 1.25);
      for (int64_t j = 0; j < E; ++j) batch_slots += batch[size_t(j)];
      std::fill(batch.begin(), batch.end(), int64_t(0));
    }
  }
  s.seq_maxvio_mean /= double(n);
  s.maxvio = max_violation(s.loads.data(), E);
  s.zero_experts = zero_count(s.loads.data(), E);
  s.dropped = s.tokens * k - s.slots;
  if (batch_slots > 0) {
    s.overflow_cf1 = double(over1) / double(batch_slots);
    s.overflow_cf125 = double(over125) / double(batch_slots);
  }
  return s;
}

}  // namespace

int64_t accumulate_routing(int64_t* loads, const int32_t* idx, const float* weight, int64_t T, int64_t k, int64_t E) {
  int64_t valid = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* it = idx + t * k;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t j = it[i];
      if (j < 0 || j >= E) continue;  // not an expert: the slot went nowhere
      bool dup = false;
      for (int64_t i2 = 0; i2 < i; ++i2) dup |= it[i2] == j;
      if (dup) continue;  // the same expert twice: one of the k slots was lost
      if (weight) {
        const float p = weight[t * k + i];
        if (!(std::isfinite(p) && p > 0)) continue;  // zero weight: dropped in effect
      }
      loads[j]++;
      valid++;
    }
  }
  return valid;
}

int64_t overflow_slots(const int64_t* loads, int64_t E, double cf) {
  int64_t total = 0;
  for (int64_t j = 0; j < E; ++j) total += loads[j];
  const int64_t cap = int64_t(std::ceil(cf * double(total) / double(E) - 1e-9));
  int64_t over = 0;
  for (int64_t j = 0; j < E; ++j) over += std::max<int64_t>(0, loads[j] - cap);
  return over;
}

void random_routing_loads(int64_t* loads, int64_t tokens, int64_t k, int64_t E, uint64_t seed) {
  K3_ASSERT(k > 0 && k <= E, "random routing needs 0 < k <= E");
  std::fill(loads, loads + E, int64_t(0));
  std::vector<int32_t> pick(static_cast<size_t>(k));
  uint64_t s = seed;
  for (int64_t t = 0; t < tokens; ++t) {
    // k distinct experts by rejection (k << E: few rejections).
    for (int64_t i = 0; i < k;) {
      const int32_t j = int32_t(splitmix64(s) % uint64_t(E));
      bool dup = false;
      for (int64_t i2 = 0; i2 < i; ++i2) dup |= pick[size_t(i2)] == j;
      if (!dup) pick[size_t(i++)] = j;
    }
    for (int64_t i = 0; i < k; ++i) loads[pick[size_t(i)]]++;
  }
}

RandomRoutingBaseline random_routing_baseline(int64_t total_tokens, int64_t seq_len, int64_t batch_tokens, int64_t k,
                                              int64_t E, uint64_t seed) {
  RandomRoutingBaseline r;
  std::vector<int64_t> loads(static_cast<size_t>(E));
  uint64_t s = seed;
  // Trials scaled so each figure costs about the same few million draws.
  const int whole = 3, seqs = 256, batches = 24;
  for (int i = 0; i < whole; ++i) {
    random_routing_loads(loads.data(), total_tokens, k, E, splitmix64(s));
    r.maxvio += max_violation(loads.data(), E) / whole;
    r.zero_experts += double(zero_count(loads.data(), E)) / whole;
  }
  for (int i = 0; i < seqs; ++i) {
    random_routing_loads(loads.data(), seq_len, k, E, splitmix64(s));
    r.seq_maxvio += max_violation(loads.data(), E) / seqs;
  }
  for (int i = 0; i < batches; ++i) {
    random_routing_loads(loads.data(), batch_tokens, k, E, splitmix64(s));
    r.batch_maxvio += max_violation(loads.data(), E) / batches;
    const double slots = double(batch_tokens * k);
    r.overflow_cf1 += double(overflow_slots(loads.data(), E, 1.0)) / slots / batches;
    r.overflow_cf125 += double(overflow_slots(loads.data(), E, 1.25)) / slots / batches;
  }
  return r;
}

HeldoutEval evaluate_heldout(const K3Model& model, const std::vector<int32_t>& heldout, int64_t seq_len,
                             int64_t max_tokens, int64_t batch_tokens, const MovingQBOptions* moving,
                             const std::vector<int32_t>* token_bytes) {
  const int64_t T = seq_len;
  if (T < 1) fail("evaluate: seq_len must be positive, got " + std::to_string(T));
  const int64_t avail = (int64_t(heldout.size()) - 1) / T;
  if (avail < 1)
    fail("evaluate: the held-out stream (" + std::to_string(heldout.size()) + " tokens) is shorter than one window of " +
         std::to_string(T + 1) + " tokens");
  const int64_t n = max_tokens > 0 ? std::min(avail, (max_tokens + T - 1) / T) : avail;
  const ModelDims& dims = model.dims();
  const int64_t first_moe = std::min(dims.first_moe, dims.L), n_moe = dims.L - first_moe;
  const int64_t E = model.config().num_experts, k = model.config().num_experts_per_token, V = dims.V;
  std::vector<int32_t> byte_ids;  // the byte tokenizer's: ids < 256 are one byte each
  if (!token_bytes) {
    byte_ids.assign(size_t(std::max<int64_t>(V, 256)), 0);
    std::fill(byte_ids.begin(), byte_ids.begin() + 256, 1);
    token_bytes = &byte_ids;
  }

  // Per window: loss, byte targets, per MoE layer loads (int32: at most T per expert) and
  // valid slots. Reduced in window order below.
  std::vector<double> nats(static_cast<size_t>(n), 0.0);
  std::vector<int64_t> bytes(static_cast<size_t>(n), 0);
  std::vector<int32_t> wloads(static_cast<size_t>(n * n_moe * E), 0);
  std::vector<int64_t> wslots(static_cast<size_t>(n * n_moe), 0);
  std::vector<int32_t> mloads(moving ? static_cast<size_t>(n * n_moe * E) : 0, 0);
  std::vector<int64_t> mslots(moving ? static_cast<size_t>(n * n_moe) : 0, 0);

  const int P = std::max(1, num_threads());
  std::vector<std::unique_ptr<EvalScratch>> scratch;
  for (int t = 0; t < P; ++t) scratch.push_back(std::make_unique<EvalScratch>());
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
#pragma omp parallel for schedule(dynamic, 1) num_threads(P)
  for (int64_t w = 0; w < n; ++w) {
    try {
      const int tid = omp_get_thread_num();
      EvalScratch& es = *scratch[size_t(tid)];
      const int32_t* ids = heldout.data() + w * T;
      es.ds.reset(dims);
      es.logits.resize(size_t(T * V));
      model.forward(es.logits.data(), ids, T, es.ds, es.fs, {}, &es.rec);
      double sum = 0;
      for (int64_t t = 0; t < T; ++t) {
        // Cross-entropy of target ids[t + 1]: log sum exp(row) - row[target], in double.
        const float* row = es.logits.data() + t * V;
        const int32_t target = ids[t + 1];
        K3_ASSERT(target >= 0 && target < V, "held-out token outside the vocabulary");
        sum += log_sum_exp(row, V) - double(row[target]);
        K3_ASSERT(size_t(target) < token_bytes->size(), "held-out token outside the vocabulary's byte table");
      }
      nats[size_t(w)] = sum;
      bytes[size_t(w)] = target_bytes(ids, T, *token_bytes);
      std::vector<int64_t>& l64 = es.loads;
      l64.resize(size_t(E));
      for (int64_t l = 0; l < n_moe; ++l) {
        const MoERouting& r = es.rec.layers[size_t(first_moe + l)].moe.routing;
        K3_ASSERT(int64_t(r.idx.size()) >= T * k, "MoE layer without a routing record");
        std::fill(l64.begin(), l64.end(), int64_t(0));
        wslots[size_t(w * n_moe + l)] =
            accumulate_routing(l64.data(), r.idx.data(), r.weight.empty() ? nullptr : r.weight.data(), T, k, E);
        int32_t* dst = wloads.data() + (w * n_moe + l) * E;
        for (int64_t j = 0; j < E; ++j) dst[j] = int32_t(l64[size_t(j)]);
        if (moving) {
          // The moving-QB selection from the same scores and the layer's global bias.
          const float* bias = model.layer(first_moe + l).moe.router_bias;
          if (!bias) {
            es.zero_bias.assign(size_t(E), 0.f);
            bias = es.zero_bias.data();
          }
          es.midx.resize(size_t(T * k));
          moving_qb_route(es.midx.data(), r.scores.data(), bias, T, E, k, *moving, es.mqb);
          std::fill(l64.begin(), l64.end(), int64_t(0));
          mslots[size_t(w * n_moe + l)] = accumulate_routing(l64.data(), es.midx.data(), nullptr, T, k, E);
          int32_t* mdst = mloads.data() + (w * n_moe + l) * E;
          for (int64_t j = 0; j < E; ++j) mdst[j] = int32_t(l64[size_t(j)]);
        }
      }
    } catch (...) {
      err[size_t(w)] = std::current_exception();
    }
  }
  for (auto& e : err)
    if (e) std::rethrow_exception(e);

  HeldoutEval r;
  r.seq_len = T, r.windows = n;
  const int64_t per_batch = std::clamp<int64_t>(batch_tokens / T, 1, n);
  r.batch_tokens = per_batch * T;
  const HeldoutTotals h = heldout_totals(nats, bytes, T);
  r.targets = h.targets, r.bytes = h.bytes, r.loss = h.loss, r.bpb = h.bpb;

  for (int64_t l = 0; l < n_moe; ++l) {
    r.layers.push_back(layer_stats(wloads, wslots, n, n_moe, l, E, k, T, per_batch));
    r.layers.back().layer = first_moe + l;
    if (moving) {
      r.moving.push_back(layer_stats(mloads, mslots, n, n_moe, l, E, k, T, per_batch));
      r.moving.back().layer = first_moe + l;
    }
  }
  r.random = random_routing_baseline(r.targets, T, r.batch_tokens, k, E);
  return r;
}

}  // namespace k3
