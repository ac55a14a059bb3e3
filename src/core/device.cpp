// Copies between the host and devices (see device.h).
#include "core/device.h"

#include <cstring>

namespace k3 {

void copy_between(Device* dst_dev, void* dst, Device* src_dev, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (!dst_dev && !src_dev) {
    std::memmove(dst, src, bytes);
  } else if (dst_dev && !src_dev) {
    dst_dev->to_device(dst, src, bytes);
  } else if (!dst_dev && src_dev) {
    src_dev->to_host(dst, src, bytes);
  } else {
    K3_ASSERT(dst_dev == src_dev, "copy_between: copies between two devices go through the host");
    dst_dev->copy(dst, src, bytes);
  }
}

}  // namespace k3
