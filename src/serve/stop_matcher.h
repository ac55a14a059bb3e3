// Stop strings on streamed text. push() takes text as it is decoded and returns what is safe
// to show: everything before the earliest occurrence of any stop string, and, while no stop
// string has appeared, all but the longest tail that could still be the start of one (held
// back until the next push decides it). Once a stop string appears, it and everything after
// are dropped and matched() is true. flush() (end of stream, no match) returns the held tail.
// Invariant (tested over every chunking): the concatenation of the outputs equals the text
// cut before the first stop string, whatever the chunks.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace k3::serve {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(std::string_view text);
  std::string flush();
  bool matched() const { return matched_; }
  const std::string& which() const { return which_; }  // the stop string that matched
  size_t held() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string which_;
};

}  // namespace k3::serve
