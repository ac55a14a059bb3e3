#include "io/stream_decoder.h"

#include "io/utf8.h"

namespace k3 {

std::string StreamDecoder::take_complete() {
  const size_t hold = utf8::incomplete_tail(pending_);
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  return take_complete();
}

std::string StreamDecoder::push(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) tok_->token_bytes(id);  // validate all before consuming any
  for (int32_t id : ids) pending_ += tok_->token_bytes(id);
  return take_complete();
}

std::string StreamDecoder::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace k3
