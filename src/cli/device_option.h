// --device cpu|cuda|cuda:N (or the environment's K3_DEVICE, when the option is absent): the
// backend an inference command runs the model on (kernels/ops.h; docs/architecture.md
// "Backends"). cpu is the default; cuda needs a build with the CUDA backend and a GPU, and
// anything else is one clear error naming the option or the variable.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "kernels/ops.h"

namespace k3::cli {

extern const char* kDeviceUsage;  // the option's usage line
// The backend asked for (null: the CPU). Opens the GPU for cuda, printing one line on stderr
// ("<command>: device cuda:0 NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB), CUDA runtime 13.0").
std::shared_ptr<const Ops> backend_from(const Args& a, const char* command);
// What `k3cpp --version` says of GPUs: the CUDA runtime and each GPU, or why there is none, or
// that this build has no CUDA backend.
std::string describe_gpus();

}  // namespace k3::cli
