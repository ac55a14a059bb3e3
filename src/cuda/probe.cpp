// The GPU's measured ceilings (see probe.h). Inputs are random (never zeros: a product ran 13 %
// faster on zeros on one of these GPUs), timed with CUDA events after a warm-up.
#include "cuda/probe.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/device.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_device.h"
#include "cuda/kernels.h"

namespace k3::cuda {

namespace {

template <typename F>
double median_ms(CudaDevice& dev, int reps, F&& f) {
  cudaEvent_t a, b;
  K3_CUDA_CHECK(cudaEventCreate(&a));
  K3_CUDA_CHECK(cudaEventCreate(&b));
  f();  // warm-up
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    K3_CUDA_CHECK(cudaEventRecord(a, dev.stream()));
    f();
    K3_CUDA_CHECK(cudaEventRecord(b, dev.stream()));
    K3_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    K3_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Random f32 values on the device (a cheap hash of the index), then bf16.
std::vector<float> host_random(size_t n, uint32_t seed) {
  std::vector<float> h(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : h) {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5;
    x = float(int32_t(s >> 8) - (1 << 23)) / float(1 << 23);
  }
  return h;
}

}  // namespace

double measure_copy_gbps(CudaDevice& dev, size_t bytes, int reps) {
  dev.make_current();
  Buf<uint8_t> a, b;
  a.place(&dev);
  b.place(&dev);
  a.resize(bytes);
  b.resize(bytes);
  const std::vector<float> r = host_random(1 << 20, 7);
  for (size_t off = 0; off + (4u << 20) <= bytes; off += 4u << 20)  // random content, 4 MB at a time
    a.write(off, reinterpret_cast<const uint8_t*>(r.data()), 4u << 20);
  const double ms = median_ms(dev, reps, [&] { dev.copy(b.data(), a.data(), bytes); });
  return 2.0 * double(bytes) / (ms * 1e-3) * 1e-9;
}

double measure_bf16_tflops(CudaDevice& dev, int n, int reps) {
  dev.make_current();
  const size_t nn = size_t(n) * size_t(n);
  Buf<float> af, c;
  Buf<uint16_t> a, b;
  for (auto* x : {&af, &c}) x->place(&dev);
  for (auto* x : {&a, &b}) x->place(&dev);
  af.append(host_random(nn, 11).data(), nn);
  a.resize(nn);
  b.resize(nn);
  c.resize(nn);
  launch_f32_to_bf16(dev.stream(), a.data(), af.data(), int64_t(nn));
  launch_f32_to_bf16(dev.stream(), b.data(), af.data(), int64_t(nn));
  cublasHandle_t h;
  K3_CUBLAS_CHECK(cublasCreate(&h));
  K3_CUBLAS_CHECK(cublasSetStream(h, dev.stream()));
  const float one = 1.f, zero = 0.f;
  const double ms = median_ms(dev, reps, [&] {
    K3_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, b.data(), CUDA_R_16BF, n, a.data(),
                                 CUDA_R_16BF, n, &zero, c.data(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  });
  cublasDestroy(h);
  return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) * 1e-12;
}

}  // namespace k3::cuda
