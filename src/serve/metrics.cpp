// Prometheus text rendering (see metrics.h).
#include "serve/metrics.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace k3::serve {

namespace {

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void family(std::ostringstream& o, const std::string& name, const char* type, const std::string& help) {
  o << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
}

template <typename T>
void scalar(std::ostringstream& o, const std::string& name, const char* type, const std::string& help, T v) {
  family(o, name, type, help);
  o << name << ' ' << v << '\n';
}

}  // namespace

std::string render_histogram(const std::string& name, const std::string& help, const LatencyHistogram& h,
                             const std::vector<double>& bounds) {
  K3_ASSERT(h.counts.empty() || h.counts.size() == bounds.size() + 1, "histogram buckets do not match its bounds");
  std::ostringstream o;
  family(o, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds.size(); ++i) {
    if (!h.counts.empty()) cum += h.counts[i];
    o << name << "_bucket{le=\"" << (i < bounds.size() ? num(bounds[i]) : "+Inf") << "\"} " << cum << '\n';
  }
  o << name << "_sum " << num(h.sum) << '\n' << name << "_count " << h.total << '\n';
  return o.str();
}

std::string render_metrics(const EngineStats& s, const std::vector<double>& bounds, const ServerCounters& c) {
  std::ostringstream o;
  scalar(o, "k3_model_loaded", "gauge", "1 once the model is loaded and requests are served.", c.loaded ? 1 : 0);
  scalar(o, "k3_requests_running", "gauge", "Requests holding a slot (prefilling or decoding).", s.running);
  scalar(o, "k3_requests_waiting", "gauge", "Requests queued for a slot.", s.waiting);
  scalar(o, "k3_requests_total", "counter", "Engine requests submitted (one per choice).", s.requests_total);
  scalar(o, "k3_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", s.prompt_tokens_total);
  scalar(o, "k3_generation_tokens_total", "counter", "Tokens generated.", s.generation_tokens_total);
  scalar(o, "k3_cached_prompt_tokens_total", "counter", "Prompt tokens restored from the prefix cache.",
         s.cached_prompt_tokens_total);
  scalar(o, "k3_prefix_cache_hits_total", "counter", "Admitted requests that restored a prefix-cache snapshot.",
         s.prefix_cache_hits);
  scalar(o, "k3_prefix_cache_misses_total", "counter", "Admitted requests that found no prefix-cache snapshot.",
         s.prefix_cache_misses);
  scalar(o, "k3_state_memory_bytes", "gauge", "Recurrent state and cache memory in use (slots and snapshots).",
         s.state_bytes);
  scalar(o, "k3_state_memory_budget_bytes", "gauge", "The state-memory budget.", s.state_budget_bytes);
  scalar(o, "k3_prefix_cache_memory_bytes", "gauge", "Memory held by prefix-cache snapshots.", s.snapshot_bytes);
  scalar(o, "k3_decode_steps_total", "counter", "Batched decode steps run.", s.steps);
  scalar(o, "k3_decode_seconds_total", "counter", "Seconds spent in batched decode steps.", num(s.step_seconds));
  scalar(o, "k3_prefill_seconds_total", "counter", "Seconds spent in prefill chunks.", num(s.prefill_seconds));
  scalar(o, "k3_schedule_seconds_total", "counter", "Seconds spent scheduling.", num(s.schedule_seconds));
  o << render_histogram("k3_time_to_first_token_seconds", "Submit to first generated token.", s.ttft, bounds);
  o << render_histogram("k3_inter_token_latency_seconds", "Time between consecutive generated tokens.", s.itl, bounds);
  family(o, "k3_http_responses_total", "counter", "HTTP responses sent, by status code.");
  for (const auto& [code, n] : c.responses_by_status) o << "k3_http_responses_total{code=\"" << code << "\"} " << n << '\n';
  scalar(o, "k3_streams_cancelled_total", "counter", "Streams whose client went away before the end.",
         c.streams_cancelled);
  scalar(o, "k3_stop_string_hits_total", "counter", "Choices ended by a stop string.", c.stop_string_hits);
  return o.str();
}

}  // namespace k3::serve
