// Scratch buffers that only ever grow: resized up to n elements, never shrunk, so a buffer
// reused across calls of different sizes reallocates only when a call needs more.
#pragma once
#include <cstdint>
#include <cstddef>

#include "core/device.h"

namespace k3 {

template <typename V>
inline void grow(V& v, int64_t n) {
  if (int64_t(v.size()) < n) v.resize(size_t(n));  // n <= size (negative too): unchanged
}

// The same for a Buf that must live on `dev` (null: the host): a buffer on another device is
// emptied and placed there first (scratch contents do not survive between calls).
template <typename T>
inline void grow(Buf<T>& b, int64_t n, Device* dev) {
  b.place(dev);
  grow(b, n);
}

}  // namespace k3
