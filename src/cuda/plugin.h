// The entry points of libk3cuda.so, the CUDA backend as a plugin (CMakeLists.txt: k3cpp links no
// CUDA library; `--device cuda` loads this one from beside the binary, cli/device_option.cpp).
// Both sides are built together from this header; kPluginAbi changes whenever it does.
#pragma once
#include <memory>
#include <string>

#include "kernels/ops.h"

namespace k3::cuda {

inline constexpr int kPluginAbi = 1;

// Returns 0 and the backend of GPU `index` in *out, or 1 and the reason in *error.
using PluginOpenFn = int (*)(int abi, int index, std::shared_ptr<const Ops>* out, std::string* error);
// The CUDA runtime and the GPUs, or why there are none (cuda_device.h describe_cuda).
using PluginDescribeFn = int (*)(int abi, std::string* out);

}  // namespace k3::cuda

extern "C" {
int k3_cuda_plugin_open(int abi, int index, std::shared_ptr<const k3::Ops>* out, std::string* error);
int k3_cuda_plugin_describe(int abi, std::string* out);
}
