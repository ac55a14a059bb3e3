// Held-out evaluation of a trained model: loss, bits per byte and the routing statistics of
// every MoE layer (docs/model.md section 6), over the whole held-out stream or a prefix of it.
//
// Windows: non-overlapping windows of seq_len + 1 tokens from the start of the held-out
// stream (window w: inputs heldout[w T, w T + T), targets shifted by one), the same windows as
// the trainer's evaluation (train/trainer.h), so the losses agree at equal settings.
//
// Per MoE layer, from the routing each window's forward actually used (ForwardRecord):
//  - loads over the whole set and MaxVio = (max_j load_j - mean) / mean over them;
//  - experts that received no token;
//  - within-sequence MaxVio: MaxVio of each window's own loads, mean and max over windows;
//  - slots: (token, expert) pairs that were routed and valid (index in [0, E), distinct
//    within the token, finite positive mixture weight); dropped = tokens * k - slots. k3cpp
//    has no capacity limit, so dropped must be 0: it is counted, not assumed;
//  - overflow: the fraction of slots a capacity-limited MoE would have dropped with capacity
//    ceil(cf * B k / E) per expert and batch, for consecutive batches of B tokens (B a
//    multiple of seq_len; the training batch), cf = 1.0 and 1.25.
// Random-routing baselines (the noise floor of each figure: k distinct experts drawn
// uniformly per token, a fixed seed) sit beside them: a balanced router cannot beat them.
//
// Deterministic: windows run in parallel (one scratch per thread), their per-window loads
// and losses are stored and reduced in window order.
#pragma once
#include <cstdint>
#include <vector>

#include "model/k3_model.h"
#include "train/moving_qb.h"

namespace k3 {

// Figures of one MoE layer over a set of windows (see the contract above).
struct LayerRoutingStats {
  int64_t layer = 0;             // decoder layer index (0-based)
  std::vector<int64_t> loads;    // [E] tokens per expert over all windows
  double maxvio = 0;             // over the whole set
  int64_t zero_experts = 0;      // experts with no token over the whole set
  double seq_maxvio_mean = 0;    // within-window MaxVio: mean over windows
  double seq_maxvio_max = 0;     //   and the worst window
  int64_t tokens = 0, slots = 0, dropped = 0;  // dropped = tokens * k - slots
  double overflow_cf1 = 0, overflow_cf125 = 0;  // fraction of slots over capacity, per batch
};

// Noise floors of the same figures under uniformly random routing (mean over trials).
struct RandomRoutingBaseline {
  double maxvio = 0;          // whole set (tokens of the evaluation)
  double seq_maxvio = 0;      // one window of seq_len tokens
  double batch_maxvio = 0;    // one batch of batch_tokens tokens (the training figure per step)
  double overflow_cf1 = 0, overflow_cf125 = 0;  // per batch
  double zero_experts = 0;    // whole set
};

struct HeldoutEval {
  int64_t seq_len = 0, windows = 0, batch_tokens = 0;
  // With Moving QB requested: the same figures for the moving-QB selection of each window
  // (train/moving_qb.h), recomputed from the scores the model's own forward produced. Exact
  // for the first MoE layer; later layers keep the inputs the static routing gave them (the
  // loss is the static routing's).
  std::vector<LayerRoutingStats> moving;
  double loss = 0;  // mean cross-entropy per target (nats)
  double bpb = 0;   // bits per byte: total cross-entropy in bits / bytes the targets decode to
  int64_t targets = 0, bytes = 0;
  std::vector<LayerRoutingStats> layers;  // one per MoE layer, in layer order
  RandomRoutingBaseline random;
};

// Per-expert loads of one routing: idx [T, k] (and optionally the mixture weights [T, k]).
// Adds into loads [E]; returns the number of valid slots (see `slots` above).
int64_t accumulate_routing(int64_t* loads, const int32_t* idx, const float* weight, int64_t T, int64_t k, int64_t E);

// Tokens a capacity of ceil(cf * sum(loads) / E) per expert would drop: sum_j max(0, load_j - C).
int64_t overflow_slots(const int64_t* loads, int64_t E, double cf);

// Loads of `tokens` tokens routed uniformly at random (k distinct experts each) from a
// splitmix64 stream seeded with `seed`; loads [E] are overwritten.
void random_routing_loads(int64_t* loads, int64_t tokens, int64_t k, int64_t E, uint64_t seed);
RandomRoutingBaseline random_routing_baseline(int64_t total_tokens, int64_t seq_len, int64_t batch_tokens, int64_t k,
                                              int64_t E, uint64_t seed = 1);

// The evaluation over `heldout` (a token stream: bos doc eos ...). max_tokens 0: every window
// that fits; else the first ceil(max_tokens / seq_len) windows. batch_tokens: the batch of
// the overflow figure (rounded down to whole windows, at least one). Threads: num_threads().
// k3::Error when the stream is shorter than one window.
// moving (optional): also the Moving QB figures (HeldoutEval::moving).
// token_bytes: bytes per id (Vocabulary::token_bytes(), special ids 0), the bits-per-byte
// denominator; null: the byte tokenizer's (ids < 256 one byte, the rest none).
HeldoutEval evaluate_heldout(const K3Model& model, const std::vector<int32_t>& heldout, int64_t seq_len,
                             int64_t max_tokens = 0, int64_t batch_tokens = 4096,
                             const MovingQBOptions* moving = nullptr, const std::vector<int32_t>* token_bytes = nullptr);

}  // namespace k3
