// --ram-budget and its companions, shared by forward / generate / chat: parsing, the loading
// path (infer/weight_stream.h load_inference_model), the plan line printed before the run,
// and the report after it (stream statistics, peak RssAnon against the budget, RssFile and
// the page cache apart).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "infer/mem_probe.h"
#include "infer/weight_stream.h"

namespace k3::cli {

// Options taking a value: ram-budget, cache-policy, io, disk-gbps, trunk-slots, head-block-rows.
const std::vector<std::string>& ram_budget_options();
// Usage lines for them.
extern const char* kRamBudgetUsage;
// `options` + ram_budget_options() + "device" (cli/device_option.h: load_budgeted places the
// model on the backend it names).
std::vector<std::string> with_ram_budget_options(std::vector<std::string> options);

// --ram-budget, --cache-policy, --io, --disk-gbps, --trunk-slots as parsed (budget 0: resident; the others
// only with a budget). tokens_per_call: the largest forward call the command makes (its
// working memory is held back from the budget).
struct BudgetArgs {
  uint64_t budget = 0;  // bytes
  StreamOptions stream;
  double disk_bytes_per_s = 0;  // 0: measured at load
};
BudgetArgs parse_budget_args(const Args& a, int64_t tokens_per_call);

// A model loaded for a run, with the RSS sampler started before loading when under a budget.
struct BudgetedModel {
  std::unique_ptr<InferenceModel> im;
  std::unique_ptr<MemSampler> sampler;
  ProcMem before;              // before loading
  int64_t page_cache_before = -1;
  uint64_t budget = 0;         // bytes (0: resident)
};

// Loads md with lo (plus --ram-budget etc. from a); prints the plan and the trunk line.
// tokens_per_call: the largest forward call the command makes (its working memory is held
// back from the budget); extra_working_bytes: held back too (speculative decoding's state).
BudgetedModel load_budgeted(const Args& a, const ModelDir& md, LoadOptions lo, const char* command,
                            int64_t tokens_per_call, uint64_t extra_working_bytes = 0);
// After one phase of a run (prefill, decode): the phase's stream statistics per token
// (bytes read per token against the plan) on one line, then the counters restart.
void report_phase(BudgetedModel& bm, const char* command, const char* phase, int64_t tokens, double seconds);
// After the run: the stream line and the memory line (stderr). No-op when resident.
void report_budgeted(BudgetedModel& bm, const char* command);

}  // namespace k3::cli
