// serve/metrics.h: Prometheus text format 0.0.4 from EngineStats and the HTTP counters.
//  - every line is a comment (# HELP / # TYPE, once per family, before its samples) or a sample
//    `name{labels} value` whose name belongs to the family typed just before;
//  - histogram buckets are cumulative, ascending in le, end in le="+Inf" equal to _count,
//    and _sum is the stats' sum; the values come from the stats given (not constants);
//  - a histogram with nothing observed yet (empty counts) renders zeros, not garbage.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "serve/metrics.h"

namespace {

struct Sample {
  std::string name, labels;
  double value;
};

std::vector<Sample> parse_prometheus(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  std::string line, typed;
  std::map<std::string, int> helps, types;
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEInfNa]+)$)");
  const std::regex meta(R"(^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, meta)) {
      if (m[1] == "HELP") ++helps[m[2]];
      else {
        ++types[m[2]];
        typed = m[2];
        EXPECT_TRUE(m[3] == "counter" || m[3] == "gauge" || m[3] == "histogram") << line;
      }
      continue;
    }
    EXPECT_TRUE(std::regex_match(line, m, sample)) << "not a sample line: '" << line << "'";
    if (!std::regex_match(line, m, sample)) continue;
    const std::string name = m[1];
    EXPECT_EQ(name.rfind(typed, 0), 0u) << name << " after # TYPE " << typed;
    out.push_back({name, m[2], std::stod(m[3].str() == "+Inf" ? "inf" : m[3].str())});
  }
  for (auto& [n, c] : types) EXPECT_EQ(c, 1) << n;
  for (auto& [n, c] : helps) EXPECT_EQ(c, 1) << n;
  return out;
}

double value(const std::vector<Sample>& s, const std::string& name, const std::string& labels = "") {
  for (const auto& x : s)
    if (x.name == name && x.labels == labels) return x.value;
  ADD_FAILURE() << "no sample " << name << labels;
  return -1;
}

}  // namespace

TEST(Metrics, RendersTheStatsInPrometheusTextFormat) {
  const std::vector<double> bounds = {0.01, 0.1, 1.0};
  k3::EngineStats s;
  s.running = 3;
  s.waiting = 5;
  s.prompt_tokens_total = 1234;
  s.generation_tokens_total = 987;
  s.prefix_cache_hits = 7;
  s.prefix_cache_misses = 11;
  s.state_bytes = 4096;
  s.ttft.counts = {1, 2, 0, 4};  // per bucket, last one +Inf
  s.ttft.total = 7;
  s.ttft.sum = 12.5;
  s.itl.counts = {10, 0, 1, 0};
  s.itl.total = 11;
  s.itl.sum = 0.75;
  k3::serve::ServerCounters c;
  c.loaded = true;
  c.responses_by_status = {{200, 9}, {400, 2}};
  const std::string text = k3::serve::render_metrics(s, bounds, c);
  const auto samples = parse_prometheus(text);
  EXPECT_EQ(value(samples, "k3_requests_running"), 3);
  EXPECT_EQ(value(samples, "k3_requests_waiting"), 5);
  EXPECT_EQ(value(samples, "k3_prompt_tokens_total"), 1234);
  EXPECT_EQ(value(samples, "k3_generation_tokens_total"), 987);
  EXPECT_EQ(value(samples, "k3_prefix_cache_hits_total"), 7);
  EXPECT_EQ(value(samples, "k3_prefix_cache_misses_total"), 11);
  EXPECT_EQ(value(samples, "k3_state_memory_bytes"), 4096);
  EXPECT_EQ(value(samples, "k3_model_loaded"), 1);
  EXPECT_EQ(value(samples, "k3_http_responses_total", "{code=\"400\"}"), 2);
  const std::string t = "k3_time_to_first_token_seconds";
  EXPECT_EQ(value(samples, t + "_bucket", "{le=\"0.01\"}"), 1);
  EXPECT_EQ(value(samples, t + "_bucket", "{le=\"0.10000000000000001\"}"), 3);
  EXPECT_EQ(value(samples, t + "_bucket", "{le=\"1\"}"), 3);
  EXPECT_EQ(value(samples, t + "_bucket", "{le=\"+Inf\"}"), 7);
  EXPECT_EQ(value(samples, t + "_count"), 7);
  EXPECT_EQ(value(samples, t + "_sum"), 12.5);
  EXPECT_EQ(value(samples, "k3_inter_token_latency_seconds_bucket", "{le=\"+Inf\"}"), 11);
  EXPECT_EQ(value(samples, "k3_inter_token_latency_seconds_sum"), 0.75);
  EXPECT_NE(text.find("# TYPE k3_time_to_first_token_seconds histogram\n"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

TEST(Metrics, EmptyHistogramIsAllZeros) {
  k3::LatencyHistogram h;  // nothing observed: no counts yet
  const std::string text = k3::serve::render_histogram("k3_x_seconds", "x", h, {0.5, 2});
  const auto samples = parse_prometheus(text);
  ASSERT_EQ(samples.size(), 5u);  // 3 buckets, sum, count
  for (const auto& s : samples) EXPECT_EQ(s.value, 0) << s.name << s.labels;
  EXPECT_EQ(samples[2].labels, "{le=\"+Inf\"}");
}
