// SSE framing and parsing (see sse.h).
#include "serve/sse.h"

namespace k3::serve {

std::string sse_event(const Json& j) { return "data: " + dump(j) + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }
std::string sse_comment(std::string_view text) { return ": " + std::string(text) + "\n\n"; }

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> events;
  auto end_line = [&]() {
    if (line_.empty()) {  // blank line: dispatch
      if (has_data_) events.push_back(data_);
      data_.clear();
      has_data_ = false;
    } else if (line_[0] != ':') {
      const size_t colon = line_.find(':');
      const std::string name = line_.substr(0, colon);
      std::string value = colon == std::string::npos ? "" : line_.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (name == "data") {
        if (has_data_) data_ += '\n';
        data_ += value;
        has_data_ = true;
      }
    }
    line_.clear();
  };
  for (char c : bytes) {
    if (c == '\n' && last_cr_) {  // the LF of a CRLF: the line already ended
      last_cr_ = false;
      continue;
    }
    last_cr_ = c == '\r';
    if (c == '\r' || c == '\n') end_line();
    else line_ += c;
  }
  return events;
}

}  // namespace k3::serve
