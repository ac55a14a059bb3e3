// `k3cpp plan <config.json> [--storage bf16|mxfp4] [--context L] [--batch B]
//              [--gpus N --gpu-mem GiB] [--ram-budget GB --disk-gbps X [--prefill-tokens T]] [--json]`
// Prints what the planner (model/planner.h) computes from the parameter table: parameters
// per component (total and active per token), weight bytes, decode cache per sequence,
// forward FLOPs per token and, with --gpus, an expert-parallel placement estimate.
// Human units beside exact integers; --json gives the same figures as one JSON object.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "io/config.h"
#include "model/planner.h"

namespace k3::cli {
namespace {

using json = nlohmann::json;

const char* kPlanUsage =
    "usage: k3cpp plan <config.json> [--storage bf16|mxfp4] [--context L] [--batch B]\n"
    "                  [--gpus N --gpu-mem GiB] [--device-gib G] [--ram-budget GB --disk-gbps X [--prefill-tokens T]]\n"
    "                  [--dp N [--qb-bins B] [--ep E]] [--json]\n"
    "  --storage  bf16: every tensor bf16; mxfp4 (default): routed experts MXFP4, rest bf16\n"
    "  --context  tokens per sequence for the cache and attention FLOPs (default 8192)\n"
    "  --batch    sequences held in the cache (default 1)\n"
    "  --gpus, --gpu-mem  expert-parallel placement on N devices of G GiB each\n"
    "  --device-gib G  whether the model (weights as stored, the decode cache for --batch sequences of\n"
    "             --context tokens) fits one device of G GiB, which --device cuda needs, and else the\n"
    "             fewest devices of G GiB (a divisor of the expert count) an expert-parallel placement needs\n"
    "  --ram-budget, --disk-gbps  memory-limited inference (trunk resident, experts streamed): bytes read\n"
    "             and the disk bound per token at this budget (GB) and disk bandwidth (GB/s)\n"
    "  --prefill-tokens  prefill chunk for that projection (default 512)\n"
    "  --dp       data-parallel training on N ranks (src/dist): bytes per rank and step for the\n"
    "             gradients and the QB histograms (--qb-bins, default 1000), memory per rank;\n"
    "             --ep E: expert parallel in groups of E of the N ranks: the all-to-all bytes per token\n"
    "             (uniform routing), the trunk's and the experts' gradient traffic, the optimiser state\n"
    "  --json     print the same figures as JSON\n";

// Counts: 2 decimals below 10, 1 decimal above ("2.78 T", "104.2 B").
std::string human_count(double v) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (std::fabs(v) >= 1000 && u < 4) { v /= 1000; ++u; }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, std::fabs(v) < 10 ? "%.2f%s" : "%.1f%s", v, units[u]);
  return buf;
}

std::string human_bytes(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 5) { v /= 1024; ++u; }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", v);
  else std::snprintf(buf, sizeof buf, std::fabs(v) < 10 ? "%.2f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string human_flops(double v) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (std::fabs(v) >= 1000 && u < 5) { v /= 1000; ++u; }
  char buf[32];
  std::snprintf(buf, sizeof buf, std::fabs(v) < 10 ? "%.2f %sFLOP" : "%.1f %sFLOP", v, units[u]);
  return buf;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  Args a(args, {"storage", "context", "batch", "gpus", "gpu-mem", "device-gib", "ram-budget", "disk-gbps", "prefill-tokens", "dp",
                "qb-bins", "ep"},
         {"json", "help"}, "plan");
  if (a.flag("help")) {
    std::fputs(kPlanUsage, stdout);
    return 0;
  }
  if (a.positional().size() > 1) fail("expected one config file, got " + std::to_string(a.positional().size()));
  const std::string path = a.positional_at(0, "config.json");
  const std::string storage_name = a.get_or("storage", "mxfp4");
  if (storage_name != "bf16" && storage_name != "mxfp4")
    fail("--storage: unknown storage '" + storage_name + "' (expected bf16 or mxfp4)");
  const WeightStorage storage = parse_weight_storage(storage_name);
  const long long context = a.get_int("context", 8192);
  const long long batch = a.get_int("batch", 1);
  if (context <= 0) fail("--context must be positive, got " + std::to_string(context));
  if (batch <= 0) fail("--batch must be positive, got " + std::to_string(batch));
  const bool want_place = a.get("gpus").has_value() || a.get("gpu-mem").has_value();
  long long gpus = 0;
  double gpu_mem = 0;
  if (want_place) {
    if (!a.get("gpus") || !a.get("gpu-mem")) fail("--gpus and --gpu-mem must be given together");
    gpus = a.get_int("gpus", 0);
    gpu_mem = a.get_double("gpu-mem", 0);
    if (gpus <= 0) fail("--gpus must be positive, got " + std::to_string(gpus));
    if (!(gpu_mem > 0) || !std::isfinite(gpu_mem)) fail("--gpu-mem must be a positive number of GiB");
  }

  const bool want_device = a.get("device-gib").has_value();
  const double device_gib = a.get_double("device-gib", 0);
  if (want_device && (!(device_gib > 0) || !std::isfinite(device_gib)))
    fail("--device-gib must be a positive number of GiB");

  const bool want_stream = a.get("ram-budget").has_value() || a.get("disk-gbps").has_value();
  double budget_gb = 0, disk_gbps = 0;
  long long prefill_tokens = 512;
  if (want_stream) {
    if (!a.get("ram-budget") || !a.get("disk-gbps")) fail("--ram-budget and --disk-gbps must be given together");
    budget_gb = a.get_double("ram-budget", 0);
    disk_gbps = a.get_double("disk-gbps", 0);
    prefill_tokens = a.get_int("prefill-tokens", 512);
    if (!(budget_gb > 0) || !std::isfinite(budget_gb)) fail("--ram-budget: expected a positive number of GB");
    if (!(disk_gbps > 0) || !std::isfinite(disk_gbps)) fail("--disk-gbps: expected a positive number of GB/s");
    if (prefill_tokens <= 0) fail("--prefill-tokens must be positive, got " + std::to_string(prefill_tokens));
  }

  const bool want_dp = a.get("dp").has_value();
  if (!want_dp && (a.get("qb-bins") || a.get("ep"))) fail("--qb-bins and --ep go with --dp");
  const long long dp_ranks = a.get_int("dp", 1), qb_bins = a.get_int("qb-bins", 1000), ep = a.get_int("ep", 1);
  if (want_dp && dp_ranks <= 0) fail("--dp must be positive, got " + std::to_string(dp_ranks));
  if (qb_bins < 2) fail("--qb-bins must be at least 2, got " + std::to_string(qb_bins));
  if (ep <= 0) fail("--ep must be positive, got " + std::to_string(ep));

  const K3Config c = load_config(path);
  DataParallelComm dpc;
  if (want_dp) dpc = project_data_parallel(c, dp_ranks, qb_bins, ep);
  StreamProjection sp;
  // The engine's rule (model/planner.h plan_streaming): the trunk resident if it fits, else its
  // layers through a ring of two slots (one if two do not fit), the embedding and lm_head held
  // if they fit, else streamed.
  if (want_stream)
    sp = plan_streaming(c, uint64_t(budget_gb * 1e9), disk_gbps * 1e9, prefill_tokens, 0, 0, 0, trunk_ring_plan(c, 0),
                        head_stream_plan(c));
  const ParamCounts pc = count_params(c);
  const WeightBytes wb = weight_bytes(c, storage);
  const CacheBytes cache = decode_cache_bytes(c, context);
  const Flops fl = forward_flops_per_token(c, context);
  Placement pl;
  if (want_place) pl = place(c, storage, gpus, gpu_mem, context, batch);
  // --device-gib: one device (everything on it), else the fewest expert-parallel devices.
  Placement one, fewest;
  if (want_device) {
    one = place(c, storage, 1, device_gib, context, batch);
    if (!one.fits())
      for (int64_t n = 2; n <= c.num_experts; ++n) {
        if (c.num_experts % n) continue;  // expert-parallel ranks divide the expert count
        const Placement p = place(c, storage, n, device_gib, context, batch);
        if (p.fits()) {
          fewest = p;
          break;
        }
        if (p.replicated_bytes + p.cache_bytes > p.capacity_bytes()) break;  // more devices cannot help
      }
  }

  if (a.flag("json")) {
    json comps = json::object();
    for (int i = 0; i < kNumComponents; ++i) {
      const ComponentCount& cc = pc.by_component[size_t(i)];
      comps[component_name(Component(i))] = {{"tensors", cc.tensors}, {"total", cc.total}, {"active", cc.active}};
    }
    json j = {
        {"config", path},
        {"parameters", {{"components", comps}, {"tensors", pc.tensors}, {"total", pc.total}, {"active", pc.active}}},
        {"weights", {{"storage", weight_storage_name(storage)},
                     {"routed_experts_bytes", wb.routed_experts},
                     {"other_bytes", wb.other},
                     {"total_bytes", wb.total()},
                     {"mxfp4_storable", wb.mxfp4_storable}}},
        {"cache", {{"context", cache.context},
                   {"kda_layers", c.kda_layers.size()},
                   {"mla_layers", c.full_attn_layers.size()},
                   {"kda_state_bytes_per_layer", cache.kda_state_per_layer},
                   {"kda_conv_bytes_per_layer", cache.kda_conv_per_layer},
                   {"mla_bytes_per_token_per_layer", cache.mla_per_token_per_layer},
                   {"kda_bytes", cache.kda_total},
                   {"mla_bytes", cache.mla_total},
                   {"total_bytes", cache.total()},
                   {"mha_bytes_per_token_per_layer", cache.mha_per_token_per_layer},
                   {"mha_total_bytes", cache.mha_total},
                   {"ratio_vs_mha", cache.ratio_vs_mha}}},
        {"flops_per_token", {{"context", context},
                             {"matmul", fl.matmul},
                             {"conv", fl.conv},
                             {"mla_attention", fl.mla_attn},
                             {"kda_state", fl.kda_state},
                             {"total", fl.total()}}},
    };
    if (want_place) {
      j["placement"] = {{"gpus", pl.gpus},
                        {"gpu_mem_gib", pl.gpu_mem_gib},
                        {"batch", batch},
                        {"experts_per_device", pl.experts_per_device},
                        {"sequences_per_device", pl.sequences_per_device},
                        {"replicated_bytes", pl.replicated_bytes},
                        {"expert_bytes", pl.expert_bytes},
                        {"cache_bytes", pl.cache_bytes},
                        {"per_device_bytes", pl.per_device_bytes()},
                        {"capacity_bytes", pl.capacity_bytes()},
                        {"fits", pl.fits()}};
    } else {
      j["placement"] = nullptr;
    }
    if (want_device)
      j["device"] = {{"gib", device_gib},
                     {"one_device_bytes", one.per_device_bytes()},
                     {"fits_one", one.fits()},
                     {"fewest_expert_parallel_devices", one.fits() ? int64_t(1) : fewest.gpus}};
    if (want_dp)
      j["data_parallel"] = {{"ranks", dpc.ranks}, {"qb_bins", dpc.bins}, {"gradient_floats", dpc.grad_floats},
                            {"trained_elements", dpc.trained}, {"histogram_ints", dpc.hist_ints},
                            {"gradient_bytes_per_rank_step", dpc.grad_bytes},
                            {"histogram_bytes_per_rank_step", dpc.hist_bytes},
                            {"optimizer_state_bytes_per_rank_zero1", dpc.opt_state_bytes_zero1},
                            {"optimizer_state_bytes_per_rank", dpc.opt_state_bytes},
                            {"weight_bytes_per_rank", dpc.weight_bytes}, {"ep", dpc.ep},
                            {"ep_alltoall_bytes_per_token", dpc.ep_bytes_per_token},
                            {"ep_train_alltoall_bytes_per_token", dpc.ep_train_bytes_per_token},
                            {"ep_trunk_gradient_bytes_per_rank_step", dpc.ep_trunk_grad_bytes},
                            {"ep_replica_gradient_bytes_per_rank_step", dpc.ep_replica_grad_bytes},
                            {"ep_optimizer_state_bytes_per_rank", dpc.ep_opt_state_bytes},
                            {"ep_optimizer_state_bytes_per_rank_zero1", dpc.ep_opt_state_bytes_zero1},
                            {"ep_weight_bytes_per_rank", dpc.ep_weight_bytes},
                            {"ep_gradient_held_bytes_per_rank", dpc.ep_grad_held_bytes},
                            {"routed_expert_floats", dpc.expert_floats}};
    if (want_stream) {
      j["streaming"] = {{"budget_bytes", sp.budget},
                        {"disk_bytes_per_s", sp.disk_bytes_per_s},
                        {"trunk_bytes", sp.trunk_bytes},
                        {"reserve_bytes", sp.reserve},
                        {"expert_bytes", sp.expert_bytes},
                        {"min_budget_bytes", sp.min_budget},
                        {"fits", sp.fits},
                        {"cache_slots", sp.cache_slots},
                        {"experts_total", sp.experts_total},
                        {"hit_rate", sp.hit_rate},
                        {"decode_bytes_per_token", sp.decode_bytes_per_token},
                        {"decode_s_per_token", sp.decode_s_per_token},
                        {"prefill_tokens", sp.prefill_tokens},
                        {"prefill_bytes_per_chunk", sp.prefill_bytes_per_chunk},
                        {"prefill_s_per_chunk", sp.prefill_s_per_chunk},
                        {"all_streamed_bytes_per_token", sp.all_streamed_bytes_per_token},
                        {"all_streamed_s_per_token", sp.all_streamed_s_per_token},
                        {"trunk_ring_slots", sp.ring.slots},
                        {"trunk_ring_slot_bytes", sp.ring.slot_bytes},
                        {"trunk_held_bytes", sp.ring.slots > 0 ? sp.ring.resident_bytes : sp.trunk_bytes},
                        {"trunk_bytes_per_call", sp.trunk_bytes_per_call},
                        {"head_streamed", sp.head.streamed},
                        {"head_held_bytes", sp.head.held_bytes},
                        {"head_buffer_bytes", sp.head.streamed ? sp.head.buffer_bytes : 0},
                        {"head_bytes_per_call", sp.head_bytes_per_call},
                        {"embed_bytes_per_token", sp.embed_bytes_per_token},
                        {"trunk_s_per_call", sp.trunk_s_per_call}};
    } else {
      j["streaming"] = nullptr;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("config %s\n", path.c_str());
  std::printf("  d %lld, %lld layers (%zu KDA, %zu MLA), %lld experts top-%lld, latent %lld, vocab %lld\n\n",
              (long long)c.hidden_size, (long long)c.num_hidden_layers, c.kda_layers.size(),
              c.full_attn_layers.size(), (long long)c.num_experts, (long long)c.num_experts_per_token,
              (long long)c.routed_expert_hidden_size, (long long)c.vocab_size);

  std::printf("parameters (active per token: top-%lld of %lld routed experts, embedding excluded)\n",
              (long long)c.num_experts_per_token, (long long)c.num_experts);
  std::printf("  %-16s %8s %10s %16s %10s %16s\n", "component", "tensors", "total", "", "active", "");
  for (int i = 0; i < kNumComponents; ++i) {
    const ComponentCount& cc = pc.by_component[size_t(i)];
    if (cc.tensors == 0) continue;
    std::printf("  %-16s %8lld %10s %16lld %10s %16lld\n", component_name(Component(i)), (long long)cc.tensors,
                human_count(double(cc.total)).c_str(), (long long)cc.total, human_count(double(cc.active)).c_str(),
                (long long)cc.active);
  }
  std::printf("  %-16s %8lld %10s %16lld %10s %16lld\n\n", "total", (long long)pc.tensors,
              human_count(double(pc.total)).c_str(), (long long)pc.total, human_count(double(pc.active)).c_str(),
              (long long)pc.active);

  std::printf("weights, storage %s (%s)\n", weight_storage_name(storage),
              storage == WeightStorage::BF16 ? "every tensor bf16"
                                             : "routed experts MXFP4 at 4.25 bits per weight, rest bf16");
  std::printf("  routed experts %12s %18llu bytes\n", human_bytes(double(wb.routed_experts)).c_str(),
              (unsigned long long)wb.routed_experts);
  std::printf("  other          %12s %18llu bytes\n", human_bytes(double(wb.other)).c_str(),
              (unsigned long long)wb.other);
  std::printf("  total          %12s %18llu bytes\n", human_bytes(double(wb.total())).c_str(),
              (unsigned long long)wb.total());
  if (storage == WeightStorage::MXFP4 && !wb.mxfp4_storable)
    std::printf("  note: routed expert widths %lld and %lld are not both multiples of 32: this config cannot be\n"
                "  stored in MXFP4; the figure above rounds each row up to whole 32-value groups\n",
                (long long)c.routed_expert_hidden_size, (long long)c.moe_intermediate_size);
  std::printf("\n");

  std::printf("decode cache per sequence at context %lld (KDA state and conv f32, MLA latent bf16)\n", context);
  std::printf("  KDA  %zu layers x (state %s + conv %s)  %12s\n", c.kda_layers.size(),
              human_bytes(double(cache.kda_state_per_layer)).c_str(),
              human_bytes(double(cache.kda_conv_per_layer)).c_str(), human_bytes(double(cache.kda_total)).c_str());
  std::printf("  MLA  %zu layers x %llu bytes per token  %12s\n", c.full_attn_layers.size(),
              (unsigned long long)cache.mla_per_token_per_layer, human_bytes(double(cache.mla_total)).c_str());
  std::printf("  total %s (%llu bytes)\n", human_bytes(double(cache.total())).c_str(),
              (unsigned long long)cache.total());
  std::printf("  standard MHA cache, %lld heads x (K %lld + V %lld) bf16 at all %lld layers: %s, %.1fx larger\n\n",
              (long long)c.num_attention_heads, (long long)c.mla_qk_head_dim(), (long long)c.v_head_dim,
              (long long)c.num_hidden_layers, human_bytes(double(cache.mha_total)).c_str(), cache.ratio_vs_mha);

  std::printf("forward FLOPs per token (causal sequence of %lld tokens)\n", context);
  std::printf("  matmul (2 x active matrix params)  %12s\n", human_flops(fl.matmul).c_str());
  std::printf("  short conv                         %12s\n", human_flops(fl.conv).c_str());
  std::printf("  MLA attention                      %12s\n", human_flops(fl.mla_attn).c_str());
  std::printf("  KDA state update                   %12s\n", human_flops(fl.kda_state).c_str());
  std::printf("  total                              %12s (%.4g)\n", human_flops(fl.total()).c_str(), fl.total());

  if (want_place) {
    std::printf("\nplacement on %lld GPUs x %g GiB (routed experts split, rest replicated, batch %lld)\n",
                (long long)pl.gpus, pl.gpu_mem_gib, batch);
    std::printf("  experts per device %lld of %lld per layer, sequences per device %lld\n",
                (long long)pl.experts_per_device, (long long)c.num_experts, (long long)pl.sequences_per_device);
    std::printf("  replicated %s + experts %s + cache %s = %s per device of %s: %s\n",
                human_bytes(double(pl.replicated_bytes)).c_str(), human_bytes(double(pl.expert_bytes)).c_str(),
                human_bytes(double(pl.cache_bytes)).c_str(), human_bytes(double(pl.per_device_bytes())).c_str(),
                human_bytes(double(pl.capacity_bytes())).c_str(), pl.fits() ? "fits" : "does NOT fit");
  }
  if (want_device) {
    std::printf("\none device of %g GiB (--device cuda holds every weight on one GPU)\n", device_gib);
    std::printf("  weights %s + cache %s = %s: %s\n", human_bytes(double(one.replicated_bytes + one.expert_bytes)).c_str(),
                human_bytes(double(one.cache_bytes)).c_str(), human_bytes(double(one.per_device_bytes())).c_str(),
                one.fits() ? "fits" : "does NOT fit");
    if (!one.fits()) {
      if (fewest.gpus > 0)
        std::printf("  expert parallel: at least %lld devices of %g GiB (%lld experts each per layer, the rest "
                    "replicated: %s per device; k3cpp's CUDA backend runs one device today)\n",
                    (long long)fewest.gpus, device_gib, (long long)fewest.experts_per_device,
                    human_bytes(double(fewest.per_device_bytes())).c_str());
      else
        std::printf("  expert parallel: no number of devices of %g GiB holds it (the replicated part alone does not "
                    "fit one)\n", device_gib);
    }
  }
  if (want_dp) {
    std::printf("\ndata-parallel training on %lld ranks (f32 weights and gradients, QB histograms of %lld bins)\n",
                (long long)dpc.ranks, (long long)dpc.bins);
    std::printf("  per rank and step: gradients %s (reduce-scatter + all-gather of %lld floats), histograms %s "
                "(%lld int64, %.2f %% of the gradients)\n",
                human_bytes(dpc.grad_bytes).c_str(), (long long)dpc.grad_floats, human_bytes(dpc.hist_bytes).c_str(),
                (long long)dpc.hist_ints, dpc.grad_bytes > 0 ? 100.0 * dpc.hist_bytes / dpc.grad_bytes : 0.0);
    std::printf("  per rank: weights %s, optimiser state %s with ZeRO-1 (%s replicated)\n",
                human_bytes(dpc.weight_bytes).c_str(), human_bytes(dpc.opt_state_bytes_zero1).c_str(),
                human_bytes(dpc.opt_state_bytes).c_str());
    if (dpc.ep > 1)
      std::printf("  expert parallel in groups of %lld ranks: %s per token forward (bf16 latent rows out and back, all "
                  "MoE layers; uniform routing); as k3cpp trains (f32, forward and backward) %s per token; gradient "
                  "reduction of the trunk %s and of the experts' replicas %s per rank and step; held per rank: "
                  "weights %s, gradients %s (with the other sources' accumulators), optimiser state %s with ZeRO-1 "
                  "of the trunk (%s replicated)\n",
                  (long long)dpc.ep, human_bytes(dpc.ep_bytes_per_token).c_str(),
                  human_bytes(dpc.ep_train_bytes_per_token).c_str(), human_bytes(dpc.ep_trunk_grad_bytes).c_str(),
                  human_bytes(dpc.ep_replica_grad_bytes).c_str(), human_bytes(dpc.ep_weight_bytes).c_str(),
                  human_bytes(dpc.ep_grad_held_bytes).c_str(), human_bytes(dpc.ep_opt_state_bytes_zero1).c_str(),
                  human_bytes(dpc.ep_opt_state_bytes).c_str());
  }
  if (want_stream) {
    std::printf("\nmemory-limited inference at %g GB, disk %g GB/s (experts streamed; the bf16 trunk resident if it "
                "fits, else streamed layer by layer; the embedding and lm_head streamed when they do not fit)\n",
                budget_gb, disk_gbps);
    std::printf("  %s\n", stream_projection_line(sp).c_str());
    std::printf("  one expert %llu bytes; nothing cached, a decode token reads %.2f GB of experts (%.2f s); the trunk "
                "streamed too: %.2f GB (%.2f s)\n",
                (unsigned long long)sp.expert_bytes,
                double(sp.moe_layers * sp.top_k) * double(sp.expert_bytes) / 1e9,
                double(sp.moe_layers * sp.top_k) * double(sp.expert_bytes) / sp.disk_bytes_per_s,
                sp.all_streamed_bytes_per_token / 1e9, sp.all_streamed_s_per_token);
  }
  return 0;
}

}  // namespace k3::cli
