// Results of the benchmarks of one run, captured as each finishes so that later benchmarks and
// the summary printed at the end can read earlier ones (ratios against the machine's peaks of
// the same run). Header-only; names live in k3::bench.
#pragma once
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace k3::bench {

struct Result {
  double real_s = 0, cpu_s = 0;  // per iteration
  std::map<std::string, double> c;
};

// Rates from the benchmark thread's CPU time instead of wall time (set before the run).
inline bool& use_cpu_time() {
  static bool cpu = false;
  return cpu;
}
inline double t_of(const Result& r) { return use_cpu_time() ? r.cpu_s : r.real_s; }
inline std::map<std::string, Result>& results() {
  static std::map<std::string, Result> res;
  return res;
}

// A console reporter that also keeps each benchmark's per-iteration times and counters, under
// its name without "/real_time", "/manual_time" and "/iterations:N"; with --benchmark_repetitions, the best run.
class Capture : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.error_occurred || r.iterations == 0 || r.run_type != Run::RT_Iteration) continue;
      Result x{r.real_accumulated_time / double(r.iterations), r.cpu_accumulated_time / double(r.iterations), {}};
      for (const auto& [k, v] : r.counters) x.c[k] = v.value;
      std::string name = r.benchmark_name();
      if (const auto at = name.find("/real_time"); at != std::string::npos) name.erase(at);
      if (const auto at = name.find("/manual_time"); at != std::string::npos) name.erase(at);
      if (const auto at = name.find("/iterations:"); at != std::string::npos) name.erase(at);
      auto it = results().find(name);
      if (it == results().end() || t_of(x) < t_of(it->second)) results()[name] = x;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

inline double counter(const std::string& name, const char* c) {
  auto it = results().find(name);
  return it == results().end() || !it->second.c.count(c) ? NAN : it->second.c.at(c);
}
// Work per iteration over the iteration's time on the chosen clock.
inline double rate(const std::string& name, double units) {
  auto it = results().find(name);
  return it == results().end() ? NAN : units / t_of(it->second);
}

// Removes a benchmark binary's own flags from argv before Google Benchmark sees it. take(a, val)
// is called with each argument a and val(key), the text after key when a starts with it (else
// null); it returns whether it consumed the argument.
template <typename F>
inline void take_own_flags(int& argc, char** argv, F&& take) {
  int w = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&a](const char* key) { return a.rfind(key, 0) == 0 ? a.c_str() + std::strlen(key) : nullptr; };
    if (!take(a, val)) argv[w++] = argv[i];
  }
  argc = w;
}

}  // namespace k3::bench
