// --ram-budget for forward / generate / chat (see ram_budget.h).
#include "cli/ram_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/device_option.h"
#include "core/error.h"
#include "model/planner.h"

namespace k3::cli {

const std::vector<std::string>& ram_budget_options() {
  static const std::vector<std::string> o = {"ram-budget", "cache-policy", "io", "disk-gbps", "trunk-slots",
                                                "head-block-rows"};
  return o;
}

const char* kRamBudgetUsage =
    "  --device D          cpu (default) or cuda[:N]: the backend the model runs on (also K3_DEVICE)\n"
    "  --ram-budget GB     memory-limited inference: hold at most GB (1e9 bytes) of weights, reading the\n"
    "                      routed experts from disk into an expert cache; the dense trunk stays resident\n"
    "                      if it fits, else its layers stream through a ring of two slots, and the\n"
    "                      embedding and lm_head are read on demand (rows, blocks) when they do not fit\n"
    "  --cache-policy P    expert cache policy: s3fifo (default) or lru\n"
    "  --io MODE           expert and trunk reads: auto (O_DIRECT where allowed, default), direct, buffered\n"
    "  --trunk-slots N     stream the dense trunk through a ring of N slots even if it fits (measurements)\n"
    "  --head-block-rows N stream the embedding and lm_head even if they fit, the logits computed in blocks\n"
    "                      of N lm_head rows (measurements; more than 32 rows per call then round as blocked)\n"
    "  --disk-gbps X       disk bandwidth for the plan line (default: measured with a 256 MB O_DIRECT read)\n";

std::vector<std::string> with_ram_budget_options(std::vector<std::string> options) {
  for (const std::string& o : ram_budget_options()) options.push_back(o);
  options.push_back("device");  // the backend the loaded model runs on (cli/device_option.h)
  return options;
}

BudgetArgs parse_budget_args(const Args& a, int64_t tokens_per_call) {
  BudgetArgs b;
  b.stream.tokens_per_call = std::max<int64_t>(tokens_per_call, 1);
  b.stream.policy = parse_cache_policy(a.get_or("cache-policy", "s3fifo"));
  b.stream.io = parse_io_mode(a.get_or("io", "auto"));
  if (a.get("disk-gbps")) {
    const double disk = a.get_double("disk-gbps", 0);
    if (!(disk > 0) || !std::isfinite(disk)) fail("--disk-gbps: expected a positive number of GB/s");
    b.disk_bytes_per_s = disk * 1e9;
  }
  if (a.get("trunk-slots")) {
    const long long n = a.get_int("trunk-slots", 0);
    if (n < 1 || n > 64) fail("--trunk-slots: expected 1 to 64 ring slots, got " + *a.get("trunk-slots"));
    b.stream.stream_trunk = true;
    b.stream.trunk_slots = n;
  }
  if (a.get("head-block-rows")) {
    const long long n = a.get_int("head-block-rows", 0);
    if (n < 1) fail("--head-block-rows: expected a positive number of rows, got " + *a.get("head-block-rows"));
    b.stream.stream_head = true;
    b.stream.head_block_rows = n;
  }
  if (a.get("ram-budget")) {
    const double gb = a.get_double("ram-budget", 0);
    if (!(gb > 0) || !std::isfinite(gb)) fail("--ram-budget: expected a positive number of GB, got " + *a.get("ram-budget"));
    b.budget = uint64_t(gb * 1e9);
  } else if (a.get("cache-policy") || a.get("io") || a.get("disk-gbps") || a.get("trunk-slots") ||
             a.get("head-block-rows")) {
    fail("--cache-policy, --io, --disk-gbps, --trunk-slots and --head-block-rows apply only with --ram-budget");
  }
  return b;
}

BudgetedModel load_budgeted(const Args& a, const ModelDir& md, LoadOptions lo, const char* command,
                            int64_t tokens_per_call, uint64_t extra_working_bytes) {
  BudgetedModel bm;
  BudgetArgs b = parse_budget_args(a, tokens_per_call);
  if (extra_working_bytes)
    b.stream.working_reserve_bytes = working_bytes_estimate(md.config, b.stream.tokens_per_call) + extra_working_bytes;
  const StreamOptions& so = b.stream;
  const double disk = b.disk_bytes_per_s;
  bm.budget = b.budget;
  lo.ram_budget_bytes = bm.budget;
  if (bm.budget) {
    bm.before = read_proc_mem();
    bm.page_cache_before = system_page_cache_bytes();
    bm.sampler = std::make_unique<MemSampler>(20);
  }
  if (!lo.backend) lo.backend = backend_from(a, command);
  bm.im = std::make_unique<InferenceModel>(load_inference_model(md, lo, so, disk));
  if (bm.budget) {
    std::fprintf(stderr, "%s: %s\n", command, stream_projection_line(bm.im->plan).c_str());
    std::fprintf(stderr, "%s: %s\n", command, bm.im->trunk_note.c_str());
  }
  return bm;
}

void report_phase(BudgetedModel& bm, const char* command, const char* phase, int64_t tokens, double seconds) {
  if (!bm.budget || tokens <= 0) return;
  const StreamStats st = bm.im->stream->stats();
  const StreamProjection& p = bm.im->plan;
  const bool decode = std::string(phase) == "decode";
  const double predicted = decode ? p.decode_bytes_per_token : p.prefill_bytes_per_chunk / double(p.prefill_tokens);
  const double per_token = double(st.payload_bytes) / double(tokens);
  // The trunk's reads when it is streamed (every layer once per call) join the bound.
  TrunkStats ts;
  if (bm.im->trunk) ts = bm.im->trunk->stats();
  HeadStats hs;
  if (bm.im->head) hs = bm.im->head->stats();
  const double dev = double(st.device_bytes + ts.device_bytes + hs.device_bytes + hs.embed_device_bytes);
  const double bound = p.disk_bytes_per_s > 0 ? dev / double(tokens) / p.disk_bytes_per_s : 0;
  std::string trunk;
  if (bm.im->trunk) {
    char b[320];
    std::snprintf(b, sizeof b,
                  "; trunk read %.4f GB/token (plan %.4f GB per call) in %lld layer reads, pread %.2f s, compute "
                  "waited %.2f s for it (%.0f %% of the trunk's read time overlapped compute)",
                  double(ts.device_bytes) / double(tokens) / 1e9, p.trunk_bytes_per_call / 1e9,
                  (long long)ts.layer_reads, ts.io_seconds, ts.wait_seconds,
                  ts.io_seconds > 0 ? 100.0 * std::max(0.0, 1 - ts.wait_seconds / ts.io_seconds) : 0.0);
    trunk = b;
  }
  if (bm.im->head) {
    const HeadStats hs = bm.im->head->stats();
    char b[320];
    std::snprintf(b, sizeof b,
                  "; embedding and lm_head read %.4f GB/token (plan %.4f GB per call + %.1f KB per token) in %lld "
                  "block reads and %lld rows, compute waited %.2f s for it",
                  double(hs.device_bytes + hs.embed_device_bytes) / double(tokens) / 1e9, p.head_bytes_per_call / 1e9,
                  p.embed_bytes_per_token / 1e3, (long long)hs.block_reads, (long long)hs.embed_rows, hs.wait_seconds);
    trunk += b;
  }
  std::fprintf(stderr,
               "%s: %s: %lld tokens, %.3f s/token; experts read %.4f GB/token (plan %.4f GB/token%s), %.4f GB/token "
               "from disk%s -> disk bound %.3f s/token at %.2f GB/s (%.0f %% of the bound reached); hit rate %.3f; "
               "pread %.2f s, waited %.2f s\n",
               command, phase, (long long)tokens, seconds / double(tokens), per_token / 1e9, predicted / 1e9,
               decode ? "" : (" for a chunk of " + std::to_string(p.prefill_tokens)).c_str(),
               double(st.device_bytes) / double(tokens) / 1e9, trunk.c_str(), bound, p.disk_bytes_per_s / 1e9,
               seconds > 0 ? 100.0 * bound * double(tokens) / seconds : 0.0, st.hit_rate(), st.io_seconds,
               st.wait_seconds);
  bm.im->stream->reset_stats();
  if (bm.im->trunk) bm.im->trunk->reset_stats();
  if (bm.im->head) bm.im->head->reset_stats();
}

void report_budgeted(BudgetedModel& bm, const char* command) {
  if (!bm.budget) return;
  bm.sampler->stop();
  const ProcMem now = read_proc_mem();
  const int64_t pc = system_page_cache_bytes();
  if (bm.im->stream->stats().calls > 0)
    std::fprintf(stderr, "%s: %s\n", command, stream_stats_line(*bm.im->stream).c_str());
  if (bm.im->trunk && bm.im->trunk->stats().acquires > 0)  // report_phase printed and restarted them
    std::fprintf(stderr, "%s: %s\n", command, trunk_stats_line(*bm.im->trunk).c_str());
  if (bm.im->head && bm.im->head->stats().block_acquires > 0)
    std::fprintf(stderr, "%s: %s\n", command, head_stats_line(*bm.im->head).c_str());
  std::fprintf(stderr,
               "%s: memory: peak RssAnon %.3f GB (%.3f GB before loading) against the budget %.3f GB (%s); "
               "engine arenas: trunk %.3f GB + trunk ring %.3f GB + head buffers %.3f GB + expert cache %.3f GB; peak RssFile %.3f GB; system page cache "
               "%+.3f GB over the run (other processes included); %lld samples\n",
               command, double(bm.sampler->peak_anon()) / 1e9, double(bm.before.rss_anon) / 1e9,
               double(bm.budget) / 1e9, bm.sampler->peak_anon() <= int64_t(bm.budget) ? "under" : "OVER",
               double(bm.im->trunk_bytes) / 1e9, bm.im->trunk ? double(bm.im->trunk->arena_bytes()) / 1e9 : 0.0,
               bm.im->head ? double(bm.im->head->arena_bytes()) / 1e9 : 0.0, double(bm.im->stream->arena_bytes()) / 1e9,
               double(bm.sampler->peak_file()) / 1e9,
               pc >= 0 && bm.page_cache_before >= 0 ? double(pc - bm.page_cache_before) / 1e9 : 0.0,
               (long long)bm.sampler->samples());
  (void)now;
}

}  // namespace k3::cli
