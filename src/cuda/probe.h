// The GPU's two ceilings, measured in the run that reports against them (docs/benchmarks.md,
// CUDA section): the device-to-device copy bandwidth (bytes read plus bytes written) and the
// bf16 tensor-core matrix rate of cuBLAS (f32 accumulation) on random data.
#pragma once
#include <cstddef>

namespace k3::cuda {

class CudaDevice;

// GB/s of cudaMemcpyAsync device to device over `bytes` (median of reps).
double measure_copy_gbps(CudaDevice& dev, size_t bytes = size_t(4) << 30, int reps = 5);
// TFLOP/s of an n x n x n bf16 GEMM (f32 output and accumulation; median of reps).
double measure_bf16_tflops(CudaDevice& dev, int n = 8192, int reps = 5);

}  // namespace k3::cuda
