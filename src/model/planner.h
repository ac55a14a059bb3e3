// Planner: parameter counts, weight bytes, decode-cache bytes, forward FLOPs per token and
// an expert-parallel placement estimate, all computed from the parameter table
// (model/param_specs.h) so that they can never drift from what the loader expects.
// Used by `k3cpp plan`. docs/model.md section 1 gives the figures a correct count
// reproduces for the released config: about 2.78 T total, 104.2 B active per token.
#pragma once
#include <array>
#include <vector>
#include <cstdint>
#include <string>

#include "io/config.h"
#include "model/param_specs.h"

namespace k3 {

struct ComponentCount {
  int64_t tensors = 0;
  int64_t total = 0;   // parameters
  int64_t active = 0;  // parameters touched per token
};

struct ParamCounts {
  std::array<ComponentCount, kNumComponents> by_component{};  // indexed by int(Component)
  int64_t total = 0, active = 0, tensors = 0;
  const ComponentCount& of(Component c) const { return by_component[size_t(c)]; }
};

// Active per token: routed experts count top-k of E in every MoE layer; the embedding is a
// lookup and counts 0; every other tensor counts in full.
ParamCounts count_params(const K3Config& c);

// "bf16": every tensor bf16. "mxfp4": routed experts MXFP4 (4.25 bits per weight: packed
// nibbles plus one E8M0 scale per 32), everything else bf16 (the released layout, section 1).
enum class WeightStorage { BF16, MXFP4 };
WeightStorage parse_weight_storage(const std::string& s);  // throws k3::Error on unknown names
const char* weight_storage_name(WeightStorage s);

struct WeightBytes {
  uint64_t routed_experts = 0;  // all routed expert matrices
  uint64_t other = 0;           // everything else
  // False when some routed expert input width is not a multiple of 32: such a config cannot
  // be stored in MXFP4 and the mxfp4 figure (rows rounded up to whole groups) is an estimate.
  bool mxfp4_storable = true;
  uint64_t total() const { return routed_experts + other; }
};
WeightBytes weight_bytes(const K3Config& c, WeightStorage s);

// Decode cache for ONE sequence holding `context` tokens.
//  KDA layer (independent of context): recurrent state H x D x D in f32, plus the short-conv
//  state: the last K-1 inputs of q, k and v, 3 x (K-1) x H*D in f32.
//  MLA layer: (kv_lora + rope) values per token in bf16 (the latent cache, section 4).
//  Baseline: a standard multi-head KV cache with the MLA heads at EVERY layer, K = nope+rope
//  and V = v per head, bf16: Hm x (nope + rope + v) x 2 bytes per token and layer.
struct CacheBytes {
  int64_t context = 0;
  uint64_t kda_state_per_layer = 0, kda_conv_per_layer = 0;
  uint64_t mla_per_token_per_layer = 0;
  uint64_t kda_total = 0, mla_total = 0;
  uint64_t total() const { return kda_total + mla_total; }
  uint64_t mha_per_token_per_layer = 0;
  uint64_t mha_total = 0;             // all layers standard MHA
  double ratio_vs_mha = 0;            // mha_total / total()
};
CacheBytes decode_cache_bytes(const K3Config& c, int64_t context);

// Forward FLOPs per token, averaged over a causal sequence of `context` tokens (a token
// attends to context/2 keys on average):
//  matmul   = 2 x (active parameters in rank-2 tensors, embedding excluded)
//  conv     = 2 x K per channel of q, k, v in every KDA layer (3 x H*D channels)
//  mla_attn = 2 x Hm x (qk + v) x context/2 per MLA layer (scores q.k and the weighted sum
//             of v, qk = nope + rope)
//  kda_state= 7 x H x D^2 per KDA layer (decay D^2, S^T k 2D^2, k u^T update 2D^2,
//             S^T q 2D^2: the recurrent form of section 3)
struct Flops {
  double matmul = 0, conv = 0, mla_attn = 0, kda_state = 0;
  double total() const { return matmul + conv + mla_attn + kda_state; }
};
Flops forward_flops_per_token(const K3Config& c, int64_t context);

// Expert-parallel placement on `gpus` devices of `gpu_mem_gib` GiB each: routed experts of
// every MoE layer split across devices (ceil(E / gpus) per device), everything else
// replicated; attention is data-parallel, so each device holds the cache of
// ceil(batch / gpus) sequences of `context` tokens. Weights and cache only (no activations).
struct Placement {
  int64_t gpus = 0;
  double gpu_mem_gib = 0;
  int64_t experts_per_device = 0, sequences_per_device = 0;
  uint64_t replicated_bytes = 0, expert_bytes = 0, cache_bytes = 0;
  uint64_t per_device_bytes() const { return replicated_bytes + expert_bytes + cache_bytes; }
  uint64_t capacity_bytes() const;
  bool fits() const { return per_device_bytes() <= capacity_bytes(); }
};
// Throws k3::Error for gpus <= 0, gpu_mem_gib <= 0, context <= 0 or batch <= 0.
Placement place(const K3Config& c, WeightStorage s, int64_t gpus, double gpu_mem_gib, int64_t context,
                int64_t batch);

// Data-parallel training over `ranks` ranks as src/dist runs it (docs/distributed.md), per
// optimizer step and rank, averaged over the ranks (an owner's share depends on where the
// parameter boundaries fall; the sum over ranks is exact):
//  gradients  = 4 G (N-1)/N reduce-scatter + 4 G (N-1)/N all-gather (of the updated parameters
//               with ZeRO-1, of the gradients without), G = the f32 gradient buffer (every
//               parameter, router biases and alignment padding included);
//  histograms = 8 H (N-1)/N twice (reduce-scatter, all-gather of int64), H = MoE layers x
//               (1 + E + E x bins) (qb-hist: the tokens, the loads, the bin counts);
//  optimiser state per rank = 8 P / N with ZeRO-1 (8 P without), P the trained elements;
//  weights per rank = 4 G (f32 master weights, replicated).
// Expert parallelism (ep ranks per group, ranks a multiple of ep): each token's k latent rows go
// to the ranks owning its experts and come back, (ep - 1)/ep of them leaving the rank (uniform
// routing; the real count is the routing's): 2 k l x bytes_per_value x (ep - 1)/ep per token
// and MoE layer, forward, bf16 (ep_bytes_per_token), and as k3cpp trains (f32, forward and
// backward, ep_train_bytes_per_token: 4 k l x 4 x (ep - 1)/ep per token and MoE layer, summed
// over the ranks; plus E/ep x 8 bytes of counts per peer and MoE layer call). The gradient
// reduction then covers the trunk only: 8 T (N-1)/N per rank and step, T = G minus the
// routed experts' floats; the owners of the same experts in the N/ep groups exchange their
// per-source accumulators, 4 X (N/ep - 1) per rank and step, X = the routed experts' floats
// (all of a layer's experts: E/ep experts x ep sources). Held per rank: weights 4 (T + X/ep),
// gradients the same plus the other ep - 1 sources' accumulators 4 X (ep-1)/ep, optimiser
// state 8 (P_T + X/ep), P_T/N of the trunk's with ZeRO-1 (P_T its trained elements).
struct DataParallelComm {
  int64_t ranks = 0, bins = 0, ep = 1;
  int64_t grad_floats = 0, trained = 0, hist_ints = 0, moe_layers = 0, expert_floats = 0;
  double grad_bytes = 0, hist_bytes = 0;           // per rank per step
  double opt_state_bytes_zero1 = 0, opt_state_bytes = 0, weight_bytes = 0;  // per rank
  double ep_bytes_per_token = 0;                   // forward, all MoE layers, bf16 values
  double ep_train_bytes_per_token = 0;             // forward + backward, all MoE layers, f32, all ranks
  double ep_trunk_grad_bytes = 0, ep_replica_grad_bytes = 0;  // per rank per step (with ep > 1)
  double ep_opt_state_bytes = 0;                   // per rank: the trunk's and 1/ep of the experts'
  double ep_opt_state_bytes_zero1 = 0;             // the same with the trunk's split over all ranks
  double ep_weight_bytes = 0;     // per rank: 4 (T + X/ep), the trunk and the rank's own experts
  double ep_grad_held_bytes = 0;  // per rank: that gradient + the other sources' accumulators, 4 X (ep-1)/ep
};
DataParallelComm project_data_parallel(const K3Config& c, int64_t ranks, int64_t qb_bins, int64_t ep = 1);

// Memory-limited inference (infer/weight_stream.h): the dense trunk resident, routed experts
// read from disk into an expert cache of whole experts. From the config, the budget and a
// disk bandwidth, before anything runs:
//  cache_slots   = (budget - trunk - reserve) / slot_bytes, at most every expert
//  hit rate      = cache_slots / experts_total  (flat routing: every expert equally likely,
//                  which Quantile Balancing makes close to true; any policy's steady state)
//  decode bytes  = moe_layers x top_k x expert_bytes x (1 - hit rate)      per token
//  prefill bytes = moe_layers x E (1 - (1 - top_k/E)^T) x expert_bytes per chunk of T tokens
//                  (each distinct expert read once per chunk, the cache cold as at the start
//                  of a prompt; a batched decode of B sequences is a chunk of B)
//  seconds       >= bytes / disk bandwidth (the bound, the trunk's reads included when it is
//                  streamed; compute comes on top)
// With the trunk streamed through a ring (infer/trunk_ring.h; `ring` given with slots > 0):
//  held          = trunk resident part (embedding, lm_head, final norms, every layer's vectors)
//                  + ring slots x slot bytes, in place of the whole trunk
//  trunk bytes   = every layer's matrices once per forward call (a decode token, a prefill
//                  chunk, a batched decode step), on top of the experts' reads
// and, for any budget, what streaming the trunk too would read with nothing cached.
// The trunk held as a ring (slots > 0) or resident (slots 0).
struct TrunkRingPlan {
  int64_t slots = 0;
  uint64_t slot_bytes = 0;      // one slot: the largest streamed layer's matrices as read
  uint64_t resident_bytes = 0;  // the trunk's other tensors, held
  uint64_t pass_bytes = 0;      // one pass over every streamed layer, as read from disk (alignment included)
  uint64_t pass_payload = 0;    // the same, matrix bytes only
  // A prefix of layers pinned: their matrices held (as the resident engine holds them) and
  // never read, the ring streaming layers pinned .. L-1 (pinned_prefix).
  int64_t pinned = 0;
  uint64_t pinned_bytes = 0;
  std::vector<uint64_t> layer_slot, layer_read, layer_payload, layer_held;  // per layer: slot, read, payload, held bytes
  uint64_t ring_bytes() const { return uint64_t(slots) * slot_bytes; }
  uint64_t held_bytes() const { return resident_bytes + ring_bytes() + pinned_bytes; }
  // The same ring with layers [0, P) pinned (slot, pass and pinned bytes recomputed from the
  // per-layer figures).
  TrunkRingPlan pinned_prefix(int64_t P) const;
};
// The ring from the config alone (the released layout: matrices bf16, vectors f32; no
// alignment widening): `k3cpp plan` for a model that is not on disk.
TrunkRingPlan trunk_ring_plan(const K3Config& c, int64_t slots);

// The embedding and lm_head (infer/head_stream.h): held (streamed false), or streamed, the
// lm_head read in blocks through owned buffers once per forward call (when it has more
// blocks than buffers; else once) and one embedding row read per token.
struct HeadStreamPlan {
  bool streamed = false;
  uint64_t held_bytes = 0;       // the embedding and lm_head as the engine holds them (what streaming frees)
  uint64_t buffer_bytes = 0;     // streamed: the lm_head block buffers + the embedding row buffer
  int64_t blocks = 0, buffers = 0, block_rows = 0;
  uint64_t pass_bytes = 0;       // one pass over the lm_head as read (alignment included)
  uint64_t embed_row_bytes = 0;  // one embedding row as read (at most: its 4096-byte aligned window)
  uint64_t bytes_per_call() const { return streamed && blocks > buffers ? pass_bytes : 0; }
  uint64_t bytes_per_token() const { return streamed ? embed_row_bytes : 0; }
  // Held bytes saved by streaming (negative never: a head smaller than its buffers is not streamed).
  uint64_t saving() const { return streamed && held_bytes > buffer_bytes ? held_bytes - buffer_bytes : 0; }
};
// From the config alone (bf16 as released, blocks of lm_head_block_rows, no alignment beyond
// the row windows): `k3cpp plan` for a model that is not on disk.
HeadStreamPlan head_stream_plan(const K3Config& c, int64_t buffers = 2);

struct StreamProjection {
  uint64_t budget = 0, trunk_bytes = 0, reserve = 0;
  uint64_t expert_bytes = 0;  // one expert's w1, w2, w3 as stored (payload)
  uint64_t slot_bytes = 0;    // one cache slot (payload plus read alignment)
  int64_t moe_layers = 0, E = 0, top_k = 0, experts_total = 0, cache_slots = 0;
  uint64_t min_budget = 0;  // trunk (or its resident part + ring) + reserve + 2 slots
  bool fits = false;        // budget >= min_budget
  TrunkRingPlan ring;       // slots 0: the trunk resident
  HeadStreamPlan head;      // streamed false: the embedding and lm_head held
  double head_bytes_per_call = 0, embed_bytes_per_token = 0;  // head streamed: lm_head per call, a row per token
  double trunk_bytes_per_call = 0, trunk_s_per_call = 0;  // ring: every layer read once per call
  double disk_bytes_per_s = 0;
  double hit_rate = 0;
  double decode_bytes_per_token = 0, decode_s_per_token = 0;
  int64_t prefill_tokens = 0;
  double prefill_bytes_per_chunk = 0, prefill_s_per_chunk = 0;
  double all_streamed_bytes_per_token = 0, all_streamed_s_per_token = 0;  // trunk + experts, nothing cached
};
// The engine's working memory for a forward call of `tokens` tokens (f32 activations and the
// scratch buffers, which grow to the largest call and are kept): per token 4 bytes x (KDA
// scratch 15 H D + MLA scratch Hm (qk + nope + 4 v) + dense / shared FFN 3 max(I, S F) +
// 4 d + blocks d + MoE k l + 4 l + E + logits V), plus 10 % and 48 MiB for the allocator,
// threads and the rest, plus the checkpoint's index while loading: 640 bytes per stored
// tensor (routed experts as MXFP4: 6 per expert). That index term is what small models
// missed: the tensor table, name indexes and the index's weight_map, built by a header walk
// with no JSON tree (io/safetensors.h HeaderParse): measured peaks 478-525 bytes per tensor
// (`bench_checkpoint_open`, one file of 37,845 and 16 shards of 200,000 tensors; the JSON tree
// took 1,166-1,408). An estimate, checked by the RssAnon measurements.
uint64_t working_bytes_estimate(const K3Config& c, int64_t tokens);
// trunk_bytes 0: the config's dense weights in bf16 (as released); slot_bytes 0: expert_bytes.
StreamProjection project_streaming(const K3Config& c, uint64_t budget, double disk_bytes_per_s,
                                   int64_t prefill_tokens = 512, uint64_t trunk_bytes = 0, uint64_t slot_bytes = 0,
                                   uint64_t reserve = 0,  // 0: working_bytes_estimate(c, prefill_tokens)
                                   const TrunkRingPlan& ring = {}, const HeadStreamPlan& head = {});
// The engine's choice of how the trunk is held (infer/weight_stream.h load_inference_model),
// the first of these that fits with the reserve and two expert slots (fewest bytes read per
// token first, then overlap):
//   1. everything resident;  2. the layers resident, the embedding and lm_head streamed;
//   3. a ring of two slots, the head held;  4. two slots, the head streamed;
//   5. one slot (reads without overlap), the head held;  6. one slot, the head streamed.
// force_ring skips 1-2, ring_slots > 0 replaces two / one by that many, force_head skips the
// head held; `ring` and `head` give the sizes (their slots / streamed are ignored; a head
// whose buffers would not save memory is never streamed unless forced). With a ring, the
// longest prefix of layers that fits is pinned (held, never read: a pinned byte saves a byte
// read per call, more than any expert cache byte, which saves top_k / E of one), leaving at
// least min(2 top_k, all experts) cache slots; for one ring size, the head held or streamed,
// whichever then reads fewer bytes per decode token (held on a tie). pinned >= 0: exactly
// that many layers pinned (tests, measurements; refused if they do not fit); force_ring
// alone pins none. When nothing
// fits: the last option's projection (its min_budget is the minimum), fits false.
StreamProjection plan_streaming(const K3Config& c, uint64_t budget, double disk_bytes_per_s, int64_t prefill_tokens,
                                uint64_t trunk_bytes, uint64_t slot_bytes, uint64_t reserve, TrunkRingPlan ring,
                                HeadStreamPlan head, bool force_ring = false, int64_t ring_slots = 0,
                                bool force_head = false, int64_t pinned = -1);
// One line: "plan: budget 8.00 GB = trunk ... ; expert cache N slots ...; predicted ...".
std::string stream_projection_line(const StreamProjection& p);

}  // namespace k3
