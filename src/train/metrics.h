// Training metrics and the terminal progress line.
//  - MetricsLog: DIR/metrics.jsonl, one JSON object per line, flushed after each record.
//    Records carry a "type": "step" (step, stage, seq_len, loss, lr, grad_norm, tokens/s,
//    MaxVio per MoE layer, sometimes the per-layer expert loads), "eval" (held-out loss and
//    bits per byte), "stage" (transitions) and "run" (start / resume / end). On resume the
//    file is cut back to the records of steps the checkpoint contains, so a run that crashed
//    after its last checkpoint does not leave duplicated steps.
//  - Progress: a live line on stderr (stage, step/total, loss, tokens/s, ETA), rewritten in
//    place with '\r' when stderr is a terminal, or printed as plain lines every few seconds
//    otherwise (CI logs). Other messages (stage transitions, evaluations) go on their own line.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace k3 {

class MetricsLog {
 public:
  MetricsLog() = default;
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Opens `path` for a fresh run (truncated) or, with keep_through_step >= 0, keeps only the
  // records whose "step" is <= keep_through_step (rewritten atomically), then appends.
  void open(const std::string& path, int64_t keep_through_step = -1);
  void write(const nlohmann::json& record);
  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);

class Progress {
 public:
  // out: the stream (stderr); tty: rewrite one line in place; quiet: print nothing.
  Progress(std::FILE* out, bool tty, bool quiet = false);
  // The live line; printed at most ~10 times a second on a terminal, every `plain_every_s`
  // seconds otherwise (force: print now).
  void update(const std::string& text, bool force = false);
  // A message on its own line (clears the live line first).
  void message(const std::string& text);
  void finish();  // ends the live line
  double plain_every_s = 10.0;

 private:
  std::FILE* out_;
  bool tty_, quiet_;
  bool live_ = false;
  size_t last_len_ = 0;
  std::chrono::steady_clock::time_point last_;
  bool printed_ = false;
};

}  // namespace k3
