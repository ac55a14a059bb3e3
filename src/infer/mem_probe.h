// The external check of a memory budget: the process's RssAnon (anonymous resident memory:
// the engine's arenas, the resident trunk, activations; not page cache) and RssFile (mapped
// file pages) from /proc/self/status, sampled by a background thread through a run, and the
// system's page cache (/proc/meminfo Cached) reported apart.
#pragma once
#include <atomic>
#include <cstdint>
#include <thread>

namespace k3 {

struct ProcMem {
  int64_t rss_anon = 0, rss_file = 0, vm_rss = 0;  // bytes (-1: not reported by this kernel)
  int64_t vm_hwm = 0;                              // peak resident since start or the last reset
};
ProcMem read_proc_mem();            // this process, now
// Resets VmHWM to the current resident size (/proc/self/clear_refs, Linux >= 4.0); false where
// it cannot be written (then VmHWM keeps the whole run's peak).
bool reset_peak_rss();
int64_t system_page_cache_bytes();  // /proc/meminfo Cached, -1 if unreadable

// Samples read_proc_mem() every period_ms from construction until stop() / destruction.
class MemSampler {
 public:
  explicit MemSampler(int period_ms = 20);
  ~MemSampler();
  MemSampler(const MemSampler&) = delete;
  MemSampler& operator=(const MemSampler&) = delete;
  void stop();
  int64_t peak_anon() const { return peak_anon_.load(); }
  int64_t peak_file() const { return peak_file_.load(); }
  int64_t samples() const { return samples_.load(); }

 private:
  void sample();
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> peak_anon_{0}, peak_file_{0}, samples_{0};
  int period_ms_;
  std::thread thread_;
};

}  // namespace k3
