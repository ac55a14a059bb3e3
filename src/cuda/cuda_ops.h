// The CUDA backend: kernels/ops.h on an NVIDIA GPU (docs/architecture.md, "Backends"). Every op
// is queued on the device's one stream; nothing waits for the GPU except a copy to the host
// (CudaDevice::to_host), so a forward pass runs as one stream of kernels and the host only
// stages token ids in and logits out. Products go to cuBLAS (f32, or bf16 tensor cores with f32
// accumulation for bf16 weights), decode-sized ones to a few-row kernel that streams the weights
// once; the rest are src/cuda/kernels/*.cu.
#pragma once
#include <memory>

#include "cuda/cuda_device.h"
#include "kernels/ops.h"

namespace k3::cuda {

// Opens GPU `index` (k3::Error, with what is wrong, when it cannot) and returns its backend.
std::shared_ptr<const Ops> make_cuda_ops(int index = 0);
// The device of a backend made by make_cuda_ops (null for any other backend).
CudaDevice* cuda_device_of(const Ops& ops);

}  // namespace k3::cuda
