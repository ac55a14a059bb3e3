// Metrics log and progress line (see metrics.h).
#include "train/metrics.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace k3 {

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::open(const std::string& path, int64_t keep_through_step) {
  if (f_) std::fclose(f_);
  f_ = nullptr;
  path_ = path;
  if (keep_through_step >= 0) {
    std::ifstream in(path);
    std::string kept, line;
    while (in && std::getline(in, line)) {
      if (line.empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        break;  // a torn last line from an interrupted run: drop it and everything after
      }
      if (j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > keep_through_step) continue;
      kept += line + "\n";
    }
    write_text_file_atomic(path, kept);
    f_ = std::fopen(path.c_str(), "ab");
  } else {
    f_ = std::fopen(path.c_str(), "wb");
  }
  if (!f_) fail_system("cannot open metrics file", path);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!f_) return;
  const std::string s = record.dump() + "\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    fail_system("cannot write metrics file", path_);
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0)) return "?";
  const int64_t s = int64_t(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else std::snprintf(buf, sizeof buf, "%llds", (long long)s);
  return buf;
}

Progress::Progress(std::FILE* out, bool tty, bool quiet) : out_(out), tty_(tty), quiet_(quiet) {}

void Progress::update(const std::string& text, bool force) {
  if (quiet_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (printed_ && !force && since < (tty_ ? 0.1 : plain_every_s)) return;
  last_ = now;
  printed_ = true;
  if (tty_) {
    std::string pad = last_len_ > text.size() ? std::string(last_len_ - text.size(), ' ') : "";
    std::fprintf(out_, "\r%s%s", text.c_str(), pad.c_str());
    last_len_ = text.size();
    live_ = true;
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

void Progress::message(const std::string& text) {
  if (quiet_) return;
  finish();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void Progress::finish() {
  if (quiet_ || !live_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  live_ = false;
  last_len_ = 0;
}

}  // namespace k3
