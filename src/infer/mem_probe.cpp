// /proc/self/status and /proc/meminfo readers and the RSS sampler (see mem_probe.h).
#include "infer/mem_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace k3 {

namespace {

// "Key:   1234 kB" -> bytes.
int64_t field_kb(const char* line, const char* key) {
  const size_t n = std::strlen(key);
  if (std::strncmp(line, key, n) != 0) return -1;
  long long kb = -1;
  if (std::sscanf(line + n, " %lld", &kb) != 1) return -1;
  return int64_t(kb) * 1024;
}

}  // namespace

ProcMem read_proc_mem() {
  ProcMem m{-1, -1, -1, -1};
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    int64_t v;
    if ((v = field_kb(line, "RssAnon:")) >= 0) m.rss_anon = v;
    else if ((v = field_kb(line, "RssFile:")) >= 0) m.rss_file = v;
    else if ((v = field_kb(line, "VmRSS:")) >= 0) m.vm_rss = v;
    else if ((v = field_kb(line, "VmHWM:")) >= 0) m.vm_hwm = v;
  }
  std::fclose(f);
  return m;
}

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

int64_t system_page_cache_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  int64_t v = -1;
  while (std::fgets(line, sizeof line, f))
    if ((v = field_kb(line, "Cached:")) >= 0) break;
  std::fclose(f);
  return v;
}

MemSampler::MemSampler(int period_ms) : period_ms_(std::max(1, period_ms)) {
  sample();
  thread_ = std::thread([this] {
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms_));
      sample();
    }
  });
}

MemSampler::~MemSampler() { stop(); }

void MemSampler::stop() {
  if (thread_.joinable()) {
    stop_ = true;
    thread_.join();
    sample();
  }
}

void MemSampler::sample() {
  const ProcMem m = read_proc_mem();
  int64_t a = peak_anon_.load(), f = peak_file_.load();
  if (m.rss_anon > a) peak_anon_ = m.rss_anon;
  if (m.rss_file > f) peak_file_ = m.rss_file;
  ++samples_;
}

}  // namespace k3
