// Scratch buffers that only ever grow: resized up to n elements, never shrunk, so a buffer
// reused across calls of different sizes reallocates only when a call needs more.
#pragma once
#include <cstdint>
#include <cstddef>

namespace k3 {

template <typename V>
inline void grow(V& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));  // n <= size (negative too): unchanged
}

}  // namespace k3
