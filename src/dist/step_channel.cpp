// The serving engine's step broadcast (see step_channel.h).
#include "dist/step_channel.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace k3::dist {

void CommStepChannel::share(std::string& bytes) {
  const bool root = comm_.rank() == 0;
  buf_.assign(size_t(8 + kInline), 0);
  int64_t n = root ? int64_t(bytes.size()) : 0;
  if (root) {
    std::memcpy(buf_.data(), &n, 8);
    std::memcpy(buf_.data() + 8, bytes.data(), size_t(std::min(n, kInline)));
  }
  comm_.bcast(buf_.data(), int64_t(buf_.size()), 0, "serve.step");
  if (!root) {
    std::memcpy(&n, buf_.data(), 8);
    if (n < 0) comm_.abort("serve: a step message of negative size from rank 0", 5);
    bytes.assign(buf_.data() + 8, size_t(std::min(n, kInline)));
    bytes.resize(size_t(n));
  }
  if (n > kInline) comm_.bcast(bytes.data() + kInline, n - kInline, 0, "serve.step.rest");
}

void CommStepChannel::abort(const std::string& msg) {
  comm_.abort(msg, 5);
  std::_Exit(5);  // not reached: Comm::abort ends the job
}

}  // namespace k3::dist
