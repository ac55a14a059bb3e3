// The CUDA device (see cuda_device.h).
#include "cuda/cuda_device.h"

#include <cstdio>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace k3::cuda {

void fail_cuda(const char* call, const char* file, int line, cudaError_t e) {
  fail(std::string("CUDA error in ") + call + " (" + file + ":" + std::to_string(line) + "): " +
       cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

void fail_cublas(const char* call, const char* file, int line, cublasStatus_t s) {
  fail(std::string("cuBLAS error in ") + call + " (" + file + ":" + std::to_string(line) + "): " +
       cublasGetStatusName(s) + ": " + cublasGetStatusString(s));
}

namespace {

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(int64_t(1) << 30));
  return b;
}

std::string version_str(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

}  // namespace

CudaDevice::CudaDevice(int index) : index_(index) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    fail(std::string("--device cuda: no usable CUDA driver or GPU (") + cudaGetErrorString(e) +
         "); this machine runs k3cpp on its CPU (omit --device)");
  if (index < 0 || index >= n)
    fail("--device cuda:" + std::to_string(index) + ": this machine has " + std::to_string(n) + " GPU(s)");
  K3_CUDA_CHECK(cudaGetDeviceProperties(&props_, index));
  if (props_.major < kMinComputeMajor)
    fail("--device cuda:" + std::to_string(index) + ": " + props_.name + " has compute capability " +
         std::to_string(props_.major) + "." + std::to_string(props_.minor) + "; k3cpp's CUDA kernels need " +
         std::to_string(kMinComputeMajor) + ".0 or later (bf16 tensor cores)");
  K3_CUDA_CHECK(cudaSetDevice(index));
  K3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // Keep freed blocks in the pool instead of returning them at each synchronisation.
  cudaMemPool_t pool;
  K3_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
  uint64_t keep = UINT64_MAX;
  K3_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  name_ = "cuda:" + std::to_string(index) + " " + props_.name + " (sm_" + std::to_string(props_.major) +
          std::to_string(props_.minor) + ", " + std::to_string(props_.multiProcessorCount) + " SMs, " +
          gib(double(props_.totalGlobalMem)) + ")";
}

CudaDevice::~CudaDevice() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

void CudaDevice::make_current() const {
  // Each host thread has its own current device (the engine computes on a thread of its own).
  thread_local int current = -1;
  if (current == index_) return;
  K3_CUDA_CHECK(cudaSetDevice(index_));
  current = index_;
}

void* CudaDevice::alloc(size_t bytes) {
  make_current();
  if (bytes == 0) bytes = 1;
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, stream_);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    fail(name_ + ": out of device memory: asked for " + gib(double(bytes)) + ", " + gib(double(free)) +
         " free of " + gib(double(total)) + " (" + cudaGetErrorString(e) + ")");
  }
  return p;
}

void CudaDevice::release(void* p) noexcept {
  if (p) cudaFreeAsync(p, stream_);
}

void CudaDevice::to_device(void* dst, const void* src, size_t bytes) {
  make_current();
  if (!bytes) return;
  K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  // The source is pageable host memory the caller may reuse at once.
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::to_host(void* dst, const void* src, size_t bytes) {
  make_current();
  if (!bytes) return;
  K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::copy(void* dst, const void* src, size_t bytes) {
  make_current();
  if (!bytes) return;
  K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaDevice::zero(void* dst, size_t bytes) {
  make_current();
  if (!bytes) return;
  K3_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaDevice::synchronize() {
  make_current();
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

int64_t CudaDevice::free_bytes() const {
  size_t free = 0, total = 0;
  K3_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return int64_t(free);
}

int64_t CudaDevice::total_bytes() const { return int64_t(props_.totalGlobalMem); }

std::string describe_cuda() {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  const cudaError_t de = cudaDriverGetVersion(&drv);
  std::string s = "CUDA runtime " + version_str(rt);
  if (de != cudaSuccess || drv == 0) return s + "; no CUDA driver (no GPU backend on this machine)";
  s += ", driver " + version_str(drv);
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return s + "; no usable GPU (" + cudaGetErrorString(e) + ")";
  if (n == 0) return s + "; no GPU";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    s += "; GPU " + std::to_string(i) + ": " + p.name + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) +
         ", " + std::to_string(p.multiProcessorCount) + " SMs, " + gib(double(p.totalGlobalMem)) + ")";
    if (p.major < kMinComputeMajor) s += " too old for k3cpp's kernels";
  }
  return s;
}

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major >= kMinComputeMajor;
}

}  // namespace k3::cuda
