// Every CUDA runtime and cuBLAS call is checked (docs/architecture.md, "Backends"): a failure
// throws k3::Error naming the call, where it was made and what the runtime said. Kernel launches
// are followed by K3_CUDA_LAUNCHED(), which checks the launch itself (bad configuration) without
// waiting for the kernel; errors inside kernels surface at the next synchronising call.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace k3::cuda {

[[noreturn]] void fail_cuda(const char* call, const char* file, int line, cudaError_t e);
[[noreturn]] void fail_cublas(const char* call, const char* file, int line, cublasStatus_t s);

}  // namespace k3::cuda

#define K3_CUDA_CHECK(call)                                                          \
  do {                                                                               \
    const cudaError_t k3_cuda_err_ = (call);                                         \
    if (k3_cuda_err_ != cudaSuccess) ::k3::cuda::fail_cuda(#call, __FILE__, __LINE__, k3_cuda_err_); \
  } while (0)

#define K3_CUBLAS_CHECK(call)                                                         \
  do {                                                                                \
    const cublasStatus_t k3_cublas_st_ = (call);                                      \
    if (k3_cublas_st_ != CUBLAS_STATUS_SUCCESS) ::k3::cuda::fail_cublas(#call, __FILE__, __LINE__, k3_cublas_st_); \
  } while (0)

#define K3_CUDA_LAUNCHED() K3_CUDA_CHECK(cudaPeekAtLastError())
