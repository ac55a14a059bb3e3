// Stop strings on streamed text (see stop_matcher.h).
#include "serve/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace k3::serve {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  // The earliest occurrence of any stop string (the longest one where two start together).
  size_t best = std::string::npos, best_len = 0;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > best_len))) {
      best = at, best_len = s.size();
      which_ = s;
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t most = std::min(s.size() - 1, held_.size());
    for (size_t k = most; k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return {};
  return std::exchange(held_, {});
}

}  // namespace k3::serve
