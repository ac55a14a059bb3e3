// Shared by the CUDA tests: skip (with the reason) where no usable GPU is present; a device and
// helpers to move data between the host and it.
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "core/device.h"
#include "cuda/cuda_device.h"

namespace k3::test {

// The process's CUDA device (GPU 0), or null when the machine has none (tests skip then).
cuda::CudaDevice* cuda_device();

#define K3_REQUIRE_CUDA()                                                      \
  do {                                                                         \
    if (!::k3::test::cuda_device()) GTEST_SKIP() << ::k3::cuda::describe_cuda(); \
  } while (0)

// A device copy of host data, and back.
template <typename T>
Buf<T> to_dev(const std::vector<T>& h) {
  Buf<T> b;
  b.place(cuda_device());
  b.append(h.data(), h.size());
  return b;
}
template <typename T>
std::vector<T> to_host(const Buf<T>& b) {
  std::vector<T> h(b.size());
  b.read(h.data(), 0, h.size());
  return h;
}
// A device buffer of n elements filled with NaN bytes (0xFF), so an element the kernel does not
// write shows up in the comparison.
template <typename T>
Buf<T> poisoned(size_t n) {
  std::vector<T> h(n);
  std::memset(h.data(), 0xFF, n * sizeof(T));
  return to_dev(h);
}

}  // namespace k3::test
