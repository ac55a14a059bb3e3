// DataParallel's transport-independent helpers (see parallel.h).
#include "train/parallel.h"

#include "core/error.h"
#include "train/train_state.h"

namespace k3 {

void DataParallel::check_identical(const void* data, size_t bytes, const std::string& what) {
  const std::string h = content_hash(data, bytes);  // 16 hex digits
  const std::vector<char> all = allgatherv(h.data(), h.size(), "check.identical");
  std::string differ;
  for (int r = 1; r < size(); ++r)
    if (std::string(all.data() + size_t(r) * h.size(), h.size()) != std::string(all.data(), h.size()))
      differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    fail("data parallel: the " + what + " of rank(s) " + differ + " differ from rank 0's (content hash " +
         std::string(all.data(), h.size()) + "); the ranks have diverged");
}

}  // namespace k3
