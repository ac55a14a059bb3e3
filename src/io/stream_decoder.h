// Streaming detokenization: ids go in one at a time (as a model generates them) and only
// complete UTF-8 characters come out. A character split across tokens is held back until its
// last byte arrives, so no U+FFFD appears for it mid-stream. Bytes that can never become
// valid (0xFF, a lead byte followed by a non-continuation, ...) are emitted at once as
// U+FFFD, as a full decode would; flush() emits a still-incomplete tail as U+FFFD. Invariant
// (tested): the concatenation of every push() and the final flush() equals
// Tiktoken::decode of all the ids.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/tiktoken.h"

namespace k3 {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tiktoken& tok) : tok_(&tok) {}
  std::string push(int32_t id);  // k3::Error for an unknown id (nothing is consumed)
  std::string push(const std::vector<int32_t>& ids);
  std::string flush();           // the held-back tail, then the decoder is empty
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string take_complete();
  const Tiktoken* tok_;
  std::string pending_;
};

}  // namespace k3
