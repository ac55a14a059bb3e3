// Planner arithmetic (see planner.h for every formula). All parameter figures are sums over
// the parameter table; nothing here repeats a tensor shape.
#include "model/planner.h"

#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "model/k3_model.h"
#include "model/weights.h"

namespace k3 {

// All routed experts have the same shapes, so "the first k experts of each layer" is an
// exact stand-in for "any k of E" when counting active parameters.
static bool is_active(const ParamSpec& s, const K3Config& c) {
  if (s.component == Component::Embedding) return false;  // a lookup, not a matmul
  if (s.component == Component::RoutedExperts) return s.expert < c.num_experts_per_token;
  return true;
}

ParamCounts count_params(const K3Config& c) {
  ParamCounts r;
  for (const ParamSpec& s : k3_param_specs(c)) {
    ComponentCount& cc = r.by_component[size_t(s.component)];
    const int64_t n = s.numel();
    cc.tensors += 1;
    cc.total += n;
    if (is_active(s, c)) cc.active += n;
  }
  for (const ComponentCount& cc : r.by_component) {
    r.total += cc.total;
    r.active += cc.active;
    r.tensors += cc.tensors;
  }
  return r;
}

WeightStorage parse_weight_storage(const std::string& s) {
  if (s == "bf16") return WeightStorage::BF16;
  if (s == "mxfp4") return WeightStorage::MXFP4;
  fail("unknown weight storage '" + s + "' (expected bf16 or mxfp4)");
}

const char* weight_storage_name(WeightStorage s) { return s == WeightStorage::BF16 ? "bf16" : "mxfp4"; }

// Bytes of one tensor under the storage scheme. MXFP4 matrices: cols/2 packed bytes and
// cols/32 scale bytes per row (section 8); rounded up per row when cols is not a multiple
// of 32 (such a config cannot actually be stored in MXFP4; the estimate stays defined).
static uint64_t spec_bytes(const ParamSpec& s, WeightStorage st) {
  if (st == WeightStorage::MXFP4 && s.component == Component::RoutedExperts) {
    const uint64_t rows = uint64_t(s.shape[0]), cols = uint64_t(s.shape[1]);
    return rows * ((cols + 1) / 2) + rows * ((cols + 31) / 32);
  }
  return uint64_t(s.numel()) * 2;  // bf16
}

WeightBytes weight_bytes(const K3Config& c, WeightStorage st) {
  WeightBytes w;
  for (const ParamSpec& s : k3_param_specs(c)) {
    if (s.component == Component::RoutedExperts) {
      w.routed_experts += spec_bytes(s, st);
      if (s.shape[1] % 32 != 0) w.mxfp4_storable = false;
    } else {
      w.other += spec_bytes(s, st);
    }
  }
  return w;
}

CacheBytes decode_cache_bytes(const K3Config& c, int64_t context) {
  if (context <= 0) fail("context length must be positive, got " + std::to_string(context));
  CacheBytes b;
  b.context = context;
  const uint64_t H = uint64_t(c.kda_num_heads), D = uint64_t(c.kda_head_dim);
  const uint64_t L = uint64_t(context);
  b.kda_state_per_layer = H * D * D * 4;                                          // f32
  b.kda_conv_per_layer = 3 * uint64_t(c.short_conv_kernel_size - 1) * H * D * 4;  // f32
  b.mla_per_token_per_layer = uint64_t(c.kv_lora_rank + c.qk_rope_head_dim) * 2;  // bf16
  b.mha_per_token_per_layer =
      uint64_t(c.num_attention_heads) * uint64_t(c.mla_qk_head_dim() + c.v_head_dim) * 2;  // bf16
  const uint64_t n_mla = c.full_attn_layers.size(), n_kda = c.kda_layers.size();
  b.kda_total = n_kda * (b.kda_state_per_layer + b.kda_conv_per_layer);
  b.mla_total = n_mla * b.mla_per_token_per_layer * L;
  b.mha_total = uint64_t(c.num_hidden_layers) * b.mha_per_token_per_layer * L;
  b.ratio_vs_mha = double(b.mha_total) / double(b.total());
  return b;
}

Flops forward_flops_per_token(const K3Config& c, int64_t context) {
  if (context <= 0) fail("context length must be positive, got " + std::to_string(context));
  Flops f;
  double matmul_params = 0;
  for (const ParamSpec& s : k3_param_specs(c))
    if (s.shape.size() == 2 && is_active(s, c)) matmul_params += double(s.numel());
  f.matmul = 2.0 * matmul_params;
  const double n_mla = double(c.full_attn_layers.size()), n_kda = double(c.kda_layers.size());
  const double H = double(c.kda_num_heads), D = double(c.kda_head_dim);
  f.conv = n_kda * 2.0 * double(c.short_conv_kernel_size) * 3.0 * H * D;
  f.mla_attn = n_mla * 2.0 * double(c.num_attention_heads) * double(c.mla_qk_head_dim() + c.v_head_dim) *
               (double(context) / 2.0);
  f.kda_state = n_kda * 7.0 * H * D * D;
  return f;
}

uint64_t working_bytes_estimate(const K3Config& c, int64_t tokens) {
  const double HD = double(c.kda_num_heads * c.kda_head_dim);
  const double mla = double(c.num_attention_heads) * double(c.mla_qk_head_dim() + c.qk_nope_head_dim + 4 * c.v_head_dim);
  const double ffn = 3.0 * double(std::max(c.intermediate_size, c.num_shared_experts * c.moe_intermediate_size));
  const double blocks = double(c.num_hidden_layers / std::max<int64_t>(c.attn_res_block_size, 1) + 2);
  const double moe = double(c.num_experts_per_token * c.routed_expert_hidden_size + 4 * c.routed_expert_hidden_size +
                            c.num_experts);
  const double per_token = 4.0 * (15.0 * HD + mla + ffn + (4.0 + blocks) * double(c.hidden_size) + moe +
                                  double(c.vocab_size));
  int64_t tensors = 0;
  for (const ParamSpec& s : k3_param_specs(c)) tensors += s.component == Component::RoutedExperts ? 2 : 1;
  return uint64_t(1.1 * per_token * double(std::max<int64_t>(tokens, 1))) + (uint64_t(48) << 20) +
         uint64_t(tensors) * 640;
}

TrunkRingPlan TrunkRingPlan::pinned_prefix(int64_t P) const {
  TrunkRingPlan r = *this;
  const int64_t L = int64_t(layer_read.size());
  r.pinned = std::clamp<int64_t>(P, 0, L);
  r.pinned_bytes = r.pass_bytes = r.pass_payload = r.slot_bytes = 0;
  for (int64_t i = 0; i < L; ++i) {
    if (i < r.pinned) {
      r.pinned_bytes += layer_held[size_t(i)];
      continue;
    }
    r.pass_bytes += layer_read[size_t(i)];
    r.pass_payload += layer_payload[size_t(i)];
    r.slot_bytes = std::max(r.slot_bytes, layer_slot[size_t(i)]);
  }
  r.slot_bytes = std::max<uint64_t>(r.slot_bytes, 1);
  return r;
}

TrunkRingPlan trunk_ring_plan(const K3Config& c, int64_t slots) {
  TrunkRingPlan p;
  p.slots = slots;
  std::vector<uint64_t> layer(size_t(c.num_hidden_layers), 0);
  for (const ParamSpec& s : k3_param_specs(c)) {
    if (s.component == Component::RoutedExperts) continue;
    if (is_streamable_layer_matrix(s)) layer[size_t(s.layer)] += uint64_t(s.numel()) * 2;
    else p.resident_bytes += uint64_t(s.numel()) * (s.shape.size() == 2 && s.shape[0] >= 2 && s.shape[1] >= 2 ? 2 : 4);
  }
  p.layer_slot = p.layer_read = p.layer_payload = p.layer_held = layer;
  for (uint64_t b : layer) {
    p.slot_bytes = std::max(p.slot_bytes, b);
    p.pass_bytes += b;
  }
  p.pass_payload = p.pass_bytes;
  return p;
}

HeadStreamPlan head_stream_plan(const K3Config& c, int64_t buffers) {
  HeadStreamPlan h;
  h.streamed = true;
  h.buffers = std::max<int64_t>(1, buffers);
  h.block_rows = lm_head_block_rows(c);
  h.blocks = (c.vocab_size + h.block_rows - 1) / h.block_rows;
  const uint64_t row = uint64_t(c.hidden_size) * 2;  // bf16
  h.pass_bytes = uint64_t(c.vocab_size) * row;
  h.embed_row_bytes = (row + 4095) / 4096 * 4096 + 4096;
  h.buffer_bytes = uint64_t(h.buffers) * ((uint64_t(h.block_rows) * row + 8191) / 4096 * 4096) + h.embed_row_bytes;
  h.held_bytes = uint64_t(c.vocab_size) * row * (c.tie_word_embeddings ? 1 : 2);
  return h;
}

StreamProjection project_streaming(const K3Config& c, uint64_t budget, double bw, int64_t prefill_tokens,
                                   uint64_t trunk_bytes, uint64_t slot_bytes, uint64_t reserve,
                                   const TrunkRingPlan& ring, const HeadStreamPlan& head) {
  StreamProjection p;
  p.budget = budget;
  p.reserve = reserve ? reserve : working_bytes_estimate(c, prefill_tokens);
  p.disk_bytes_per_s = bw;
  p.E = c.num_experts;
  p.top_k = c.num_experts_per_token;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) p.moe_layers += c.is_moe_layer(i) ? 1 : 0;
  uint64_t other = 0;
  for (const ParamSpec& s : k3_param_specs(c)) {
    if (s.component != Component::RoutedExperts) other += spec_bytes(s, WeightStorage::MXFP4);
    else if (s.expert == 0 && s.layer == c.first_k_dense_replace) p.expert_bytes += spec_bytes(s, WeightStorage::MXFP4);
  }
  p.trunk_bytes = trunk_bytes ? trunk_bytes : other;
  p.slot_bytes = slot_bytes ? slot_bytes : p.expert_bytes;
  p.experts_total = p.moe_layers * p.E;
  p.ring = ring;
  p.head = head;
  const uint64_t whole = ring.slots > 0 ? ring.held_bytes() : p.trunk_bytes;
  const uint64_t held = head.streamed ? whole - std::min(whole, head.held_bytes) + head.buffer_bytes : whole;
  p.min_budget = held + p.reserve + 2 * p.slot_bytes;
  p.fits = p.moe_layers > 0 && budget >= p.min_budget;
  if (p.fits)
    p.cache_slots = std::min<int64_t>(p.experts_total, int64_t((budget - held - p.reserve) / p.slot_bytes));
  if (ring.slots > 0) p.trunk_bytes_per_call = double(ring.pass_bytes);
  p.head_bytes_per_call = double(head.bytes_per_call());
  p.embed_bytes_per_token = double(head.bytes_per_token());
  p.hit_rate = p.experts_total > 0 ? double(p.cache_slots) / double(p.experts_total) : 0;
  const double eb = double(p.expert_bytes), miss = 1 - p.hit_rate;
  p.decode_bytes_per_token = double(p.moe_layers * p.top_k) * eb * miss;
  p.prefill_tokens = prefill_tokens;
  const double distinct =
      p.E > 0 ? double(p.E) * (1 - std::pow(1 - double(p.top_k) / double(p.E), double(prefill_tokens))) : 0;
  p.prefill_bytes_per_chunk = double(p.moe_layers) * distinct * eb;  // a cold cache
  p.all_streamed_bytes_per_token = double(p.trunk_bytes) + double(p.moe_layers * p.top_k) * eb;
  if (bw > 0) {
    const double per_call = p.trunk_bytes_per_call + p.head_bytes_per_call;
    p.decode_s_per_token = (p.decode_bytes_per_token + per_call + p.embed_bytes_per_token) / bw;
    p.prefill_s_per_chunk =
        (p.prefill_bytes_per_chunk + per_call + p.embed_bytes_per_token * double(prefill_tokens)) / bw;
    p.all_streamed_s_per_token = p.all_streamed_bytes_per_token / bw;
    p.trunk_s_per_call = p.trunk_bytes_per_call / bw;
  }
  return p;
}

StreamProjection plan_streaming(const K3Config& c, uint64_t budget, double bw, int64_t prefill_tokens,
                                uint64_t trunk_bytes, uint64_t slot_bytes, uint64_t reserve, TrunkRingPlan ring,
                                HeadStreamPlan head, bool force_ring, int64_t ring_slots, bool force_head,
                                int64_t pinned) {
  if (force_ring && pinned < 0) pinned = 0;  // a ring asked for (measurements): every layer through it
  if (reserve == 0) reserve = working_bytes_estimate(c, prefill_tokens);  // once, not per option
  HeadStreamPlan held = head, streamed = head;
  held.streamed = false;
  streamed.streamed = true;
  // Streaming a head no larger than its buffers saves nothing: held then, unless forced.
  std::vector<const HeadStreamPlan*> heads;
  if (!force_head) heads.push_back(&held);
  if (force_head || head.held_bytes > head.buffer_bytes) heads.push_back(&streamed);
  StreamProjection last;
  if (!force_ring)  // 1-2: the layers resident
    for (const HeadStreamPlan* h : heads) {
      last = project_streaming(c, budget, bw, prefill_tokens, trunk_bytes, slot_bytes, reserve, TrunkRingPlan{}, *h);
      if (last.fits) return last;
    }
  const int64_t L = int64_t(ring.layer_read.size());
  for (int64_t n : ring_slots > 0 ? std::vector<int64_t>{ring_slots} : std::vector<int64_t>{2, 1}) {
    ring.slots = n;
    StreamProjection best;
    double best_bytes = 0;
    for (const HeadStreamPlan* h : heads) {
      auto project = [&](int64_t P) {
        return project_streaming(c, budget, bw, prefill_tokens, trunk_bytes, slot_bytes, reserve,
                                 ring.pinned_prefix(P), *h);
      };
      StreamProjection p = project(std::max<int64_t>(pinned, 0));
      last = p;
      if (!p.fits) continue;
      if (pinned < 0) {
        // The longest prefix that leaves the minimum expert cache: the held bytes grow by the
        // pinned layers and shrink with the ring's slot (the largest layer left streamed).
        const int64_t want = std::min<int64_t>(p.experts_total, 2 * p.top_k);
        const uint64_t need = p.min_budget + uint64_t(std::max<int64_t>(want - 2, 0)) * p.slot_bytes;
        const uint64_t base = p.ring.held_bytes();
        for (int64_t P = L - 1; P >= 1 && budget >= need; --P) {
          const uint64_t hb = ring.pinned_prefix(P).held_bytes();
          if (hb <= base || hb - base <= budget - need) {
            p = project(P);
            break;
          }
        }
      }
      const double bytes = p.decode_bytes_per_token + p.trunk_bytes_per_call + p.head_bytes_per_call;
      if (!best.fits || bytes < best_bytes) best = p, best_bytes = bytes;
    }
    if (best.fits) return best;
  }
  return last;
}

std::string stream_projection_line(const StreamProjection& p) {
  auto gb = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
    return std::string(buf);
  };
  const TrunkRingPlan& r = p.ring;
  const HeadStreamPlan& h = p.head;
  char head[320] = "";
  if (h.streamed)
    std::snprintf(head, sizeof head,
                  "; embedding and lm_head streamed (%s held otherwise): lm_head in %lld blocks of %lld rows through "
                  "%lld buffers, %s with the row buffer, %s read per call, one embedding row per token",
                  gb(double(h.held_bytes)).c_str(), (long long)h.blocks, (long long)h.block_rows, (long long)h.buffers,
                  gb(double(h.buffer_bytes)).c_str(), gb(p.head_bytes_per_call).c_str());
  const uint64_t held_rest = r.resident_bytes - (h.streamed ? std::min(r.resident_bytes, h.held_bytes) : 0);
  char ring[768] = "";
  if (r.slots > 0)
    std::snprintf(ring, sizeof ring,
                  "trunk streamed through a ring of %lld slot%s x %s (the largest layer%s) + %s held (%s)%s%s",
                  (long long)r.slots, r.slots > 1 ? "s" : "", gb(double(r.slot_bytes)).c_str(),
                  (r.slots > 1 ? std::string("; the next layer is read while one computes")
                               : "; no overlap: a second slot needs +" + gb(double(r.slot_bytes)))
                      .c_str(),
                  gb(double(held_rest)).c_str(), h.streamed ? "norms and vectors" : "embedding, lm_head, norms",
                  r.pinned > 0 ? (" + " + std::to_string(r.pinned) + " leading layers pinned (" +
                                  gb(double(r.pinned_bytes)) + ", never read)").c_str()
                               : "",
                  head);
  char buf[2048];
  if (!p.fits) {
    if (r.slots > 0)
      std::snprintf(buf, sizeof buf,
                    "plan: budget %s is below the minimum %s (%s, %s working memory, 2 expert slots of %.1f MB); "
                    "streaming the whole trunk and every expert would read %s per token (%.2f s at %.2f GB/s)",
                    gb(double(p.budget)).c_str(), gb(double(p.min_budget)).c_str(), ring, gb(double(p.reserve)).c_str(),
                    double(p.slot_bytes) / 1e6, gb(p.all_streamed_bytes_per_token).c_str(), p.all_streamed_s_per_token,
                    p.disk_bytes_per_s / 1e9);
    else
      std::snprintf(buf, sizeof buf,
                    "plan: budget %s is below the resident minimum %s (dense trunk %s resident%s, %s working memory, 2 "
                    "expert slots of %.1f MB)",
                    gb(double(p.budget)).c_str(), gb(double(p.min_budget)).c_str(), gb(double(p.trunk_bytes)).c_str(),
                    head, gb(double(p.reserve)).c_str(), double(p.slot_bytes) / 1e6);
    return buf;
  }
  const std::string trunk = r.slots > 0 ? std::string(ring)
                                        : h.streamed ? "trunk " + gb(double(p.trunk_bytes - std::min(p.trunk_bytes, h.held_bytes))) +
                                                           " resident" + head
                                                     : "trunk " + gb(double(p.trunk_bytes)) + " resident";
  const double per_call = p.trunk_bytes_per_call + p.head_bytes_per_call;
  const std::string trunk_reads =
      per_call > 0 ? (p.head_bytes_per_call > 0 ? " + trunk and lm_head " : " + trunk ") + gb(per_call) : "";
  const double bw = p.disk_bytes_per_s;
  std::snprintf(buf, sizeof buf,
                "plan: budget %s = %s + %s working + expert cache %lld slots x %.1f MB (%.1f %% of %lld experts); "
                "flat-routing hit rate %.3f; decode reads %s/token of experts%s -> >= %.3f s/token at %.2f GB/s; "
                "prefill chunk of %lld tokens reads %s%s -> >= %.2f s",
                gb(double(p.budget)).c_str(), trunk.c_str(), gb(double(p.reserve)).c_str(), (long long)p.cache_slots,
                double(p.slot_bytes) / 1e6, 100.0 * p.hit_rate, (long long)p.experts_total, p.hit_rate,
                gb(p.decode_bytes_per_token).c_str(), trunk_reads.c_str(), p.decode_s_per_token, bw / 1e9,
                (long long)p.prefill_tokens, gb(p.prefill_bytes_per_chunk).c_str(), trunk_reads.c_str(),
                p.prefill_s_per_chunk);
  return buf;
}

uint64_t Placement::capacity_bytes() const { return uint64_t(gpu_mem_gib * 1024.0 * 1024.0 * 1024.0); }

Placement place(const K3Config& c, WeightStorage st, int64_t gpus, double gpu_mem_gib, int64_t context,
                int64_t batch) {
  if (gpus <= 0) fail("number of GPUs must be positive, got " + std::to_string(gpus));
  if (!(gpu_mem_gib > 0) || !std::isfinite(gpu_mem_gib)) fail("GPU memory must be a positive number of GiB");
  if (batch <= 0) fail("batch must be positive, got " + std::to_string(batch));
  Placement p;
  p.gpus = gpus;
  p.gpu_mem_gib = gpu_mem_gib;
  p.experts_per_device = (c.num_experts + gpus - 1) / gpus;
  p.sequences_per_device = (batch + gpus - 1) / gpus;
  uint64_t expert0_bytes = 0;  // expert 0 of every MoE layer; all experts are the same size
  for (const ParamSpec& s : k3_param_specs(c)) {
    if (s.component != Component::RoutedExperts) p.replicated_bytes += spec_bytes(s, st);
    else if (s.expert == 0) expert0_bytes += spec_bytes(s, st);
  }
  p.expert_bytes = uint64_t(p.experts_per_device) * expert0_bytes;
  p.cache_bytes = uint64_t(p.sequences_per_device) * decode_cache_bytes(c, context).total();
  return p;
}

DataParallelComm project_data_parallel(const K3Config& c, int64_t ranks, int64_t qb_bins, int64_t ep) {
  if (ranks <= 0) fail("data-parallel ranks must be positive, got " + std::to_string(ranks));
  if (qb_bins < 2) fail("histogram bins must be at least 2, got " + std::to_string(qb_bins));
  if (ep <= 0) fail("expert-parallel ranks must be positive, got " + std::to_string(ep));
  DataParallelComm d;
  d.ranks = ranks, d.bins = qb_bins, d.ep = ep;
  const ParamLayout lay(c, ExpertStorage::Plain);
  d.grad_floats = lay.total_floats();
  for (const ParamSpec& s : lay.specs())
    if (s.name.find("e_score_correction_bias") == std::string::npos) d.trained += s.numel();
  d.moe_layers = std::max<int64_t>(0, c.num_hidden_layers - c.first_k_dense_replace);
  d.hist_ints = d.moe_layers * (1 + c.num_experts + c.num_experts * qb_bins);
  const double f = double(ranks - 1) / double(ranks);
  d.grad_bytes = 2.0 * 4.0 * double(d.grad_floats) * f;
  d.hist_bytes = 2.0 * 8.0 * double(d.hist_ints) * f;
  d.opt_state_bytes = 8.0 * double(d.trained);
  d.opt_state_bytes_zero1 = d.opt_state_bytes / double(ranks);
  d.weight_bytes = 4.0 * double(d.grad_floats);
  if (ranks % ep != 0)
    fail("--ep " + std::to_string(ep) + " must divide the " + std::to_string(ranks) + " ranks (--dp)");
  d.ep_bytes_per_token = 2.0 * double(c.num_experts_per_token) * double(c.routed_expert_hidden_size) * 2.0 *
                         double(ep - 1) / double(ep) * double(d.moe_layers);
  d.ep_train_bytes_per_token = 4.0 * double(c.num_experts_per_token) * double(c.routed_expert_hidden_size) * 4.0 *
                               double(ep - 1) / double(ep) * double(d.moe_layers);
  int64_t expert_trained = 0;
  for (const ParamSpec& s : lay.specs())
    if (s.component == Component::RoutedExperts) d.expert_floats += s.numel();
  expert_trained = d.expert_floats;
  d.ep_trunk_grad_bytes = 2.0 * 4.0 * double(d.grad_floats - d.expert_floats) * f;
  d.ep_replica_grad_bytes = 4.0 * double(d.expert_floats) * double(ranks / ep - 1);
  d.ep_opt_state_bytes = 8.0 * (double(d.trained - expert_trained) + double(expert_trained) / double(ep));
  d.ep_opt_state_bytes_zero1 = 8.0 * (double(d.trained - expert_trained) / double(ranks) + double(expert_trained) / double(ep));
  const double held = 4.0 * (double(d.grad_floats - d.expert_floats) + double(d.expert_floats) / double(ep));
  d.ep_weight_bytes = held;
  d.ep_grad_held_bytes = held + 4.0 * double(d.expert_floats) * double(ep - 1) / double(ep);
  return d;
}

}  // namespace k3
