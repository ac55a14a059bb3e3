// The CUDA device of the CUDA backend (src/cuda; docs/architecture.md, "Backends"): memory from
// the stream-ordered allocator (cudaMallocAsync: freed blocks are reused without a device-wide
// synchronisation), copies on the backend's one stream, a copy to the host returning once the
// data is there. Opening a device checks, with one clear error each, that a driver and a GPU
// are there and that the GPU is new enough (compute capability 8.0 or later).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "core/device.h"

namespace k3::cuda {

inline constexpr int kMinComputeMajor = 8;  // mma.sync bf16 (sm_80); Hopper's wgmma needs 9.0

class CudaDevice final : public Device {
 public:
  // Opens GPU `index` (k3::Error if there is no driver, no such GPU, or it is too old).
  explicit CudaDevice(int index);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override { return name_; }
  void* alloc(size_t bytes) override;
  void release(void* p) noexcept override;
  void to_device(void* dst, const void* host_src, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  void synchronize() override;
  int64_t free_bytes() const override;
  int64_t total_bytes() const override;

  int index() const { return index_; }
  cudaStream_t stream() const { return stream_; }
  const cudaDeviceProp& props() const { return props_; }
  bool hopper() const { return props_.major == 9; }
  // Makes this device current on the calling thread (the engine computes on its own thread).
  void make_current() const;

 private:
  int index_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  std::string name_;
};

// "CUDA runtime 13.0, driver 13.0; GPU 0: NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)", or why there
// is no usable GPU ("no CUDA driver: ..."), for `k3cpp --version`. Never throws.
std::string describe_cuda();
// Whether a usable GPU is there (the tests skip with describe_cuda() when not).
bool cuda_available();

}  // namespace k3::cuda
