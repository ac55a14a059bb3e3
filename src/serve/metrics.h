// GET /metrics: the engine's statistics (infer/engine.h EngineStats) and the HTTP layer's own
// counters in Prometheus' text exposition format 0.0.4: `# HELP` and `# TYPE` once per family,
// counters named *_total, histograms as cumulative `_bucket{le="..."}` series ending in
// le="+Inf" (equal to `_count`), then `_sum` and `_count`. Names are prefixed `k3_`.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "infer/engine.h"

namespace k3::serve {

struct ServerCounters {
  std::map<int, uint64_t> responses_by_status;  // HTTP status -> responses sent
  uint64_t streams_cancelled = 0;               // client went away mid-stream
  uint64_t stop_string_hits = 0;
  bool loaded = false;
};

// `bounds`: the histograms' upper bounds (LatencyHistogram::bounds()); each histogram's counts
// hold bounds.size() + 1 buckets (the last is +Inf) or are empty (nothing observed yet).
std::string render_metrics(const EngineStats& s, const std::vector<double>& bounds, const ServerCounters& c);

// One histogram family (exposed for tests).
std::string render_histogram(const std::string& name, const std::string& help, const LatencyHistogram& h,
                             const std::vector<double>& bounds);

}  // namespace k3::serve
