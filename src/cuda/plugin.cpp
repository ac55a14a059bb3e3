// libk3cuda.so's entry points (see plugin.h): no exception crosses them.
#include "cuda/plugin.h"

#include "cuda/cuda_device.h"
#include "cuda/cuda_ops.h"

extern "C" __attribute__((visibility("default"))) int k3_cuda_plugin_open(int abi, int index,
                                                                          std::shared_ptr<const k3::Ops>* out,
                                                                          std::string* error) {
  if (abi != k3::cuda::kPluginAbi) {
    *error = "libk3cuda.so was built for another k3cpp (plugin ABI " + std::to_string(k3::cuda::kPluginAbi) +
             ", the binary wants " + std::to_string(abi) + ")";
    return 1;
  }
  try {
    *out = k3::cuda::make_cuda_ops(index);
    return 0;
  } catch (const std::exception& e) {
    *error = e.what();
    return 1;
  }
}

extern "C" __attribute__((visibility("default"))) int k3_cuda_plugin_describe(int abi, std::string* out) {
  if (abi != k3::cuda::kPluginAbi) return 1;
  *out = k3::cuda::describe_cuda();
  return 0;
}
