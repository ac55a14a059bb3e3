// Server-sent events as OpenAI streams them: each event is `data: <compact JSON>\n\n`, the
// stream ends with `data: [DONE]\n\n`; a line starting with ':' is a comment (sent as a
// keep-alive when nothing else is, ignored by clients). SseParser is the client side
// (WHATWG event-stream rules for the parts OpenAI uses: data fields joined by '\n', events
// dispatched on a blank line, comments and other fields ignored, CRLF or LF line ends),
// used by the tests to read the server's streams in any chunking.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "serve/api_error.h"

namespace k3::serve {

std::string sse_event(const Json& j);      // "data: {...}\n\n"
std::string sse_done();                    // "data: [DONE]\n\n"
std::string sse_comment(std::string_view text);  // ": text\n\n"

class SseParser {
 public:
  // Bytes in any chunking -> the data of each event completed by them.
  std::vector<std::string> feed(std::string_view bytes);
  bool idle() const { return line_.empty() && data_.empty() && !has_data_; }  // nothing half-read

 private:
  std::string line_, data_;
  bool has_data_ = false, last_cr_ = false;
};

}  // namespace k3::serve
