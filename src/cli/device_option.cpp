// --device (see device_option.h).
#include "cli/device_option.h"

#include <cstdio>
#include <cstdlib>

#include <dlfcn.h>
#include <unistd.h>

#include <climits>

#include "core/error.h"
#ifdef K3_HAVE_CUDA_PLUGIN
#include "cuda/plugin.h"
#endif

namespace k3::cli {

#ifdef K3_HAVE_CUDA_PLUGIN
namespace {

// libk3cuda.so beside the running binary (K3_CUDA_PLUGIN names another), loaded once and kept
// for the process's life. Null with the reason in *why when it cannot be loaded.
void* cuda_plugin(std::string* why) {
  static std::string error;
  static void* handle = [] {
    std::string path;
    if (const char* e = std::getenv("K3_CUDA_PLUGIN"); e && *e) {
      path = e;
    } else {
      char exe[PATH_MAX];
      const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
      if (n <= 0) {
        error = "cannot find the k3cpp binary's directory (/proc/self/exe)";
        return static_cast<void*>(nullptr);
      }
      exe[n] = 0;
      path = std::string(exe);
      path = path.substr(0, path.rfind('/') + 1) + "libk3cuda.so";
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) error = std::string("cannot load the CUDA backend ") + path + ": " + ::dlerror();
    return h;
  }();
  if (!handle && why) *why = error;
  return handle;
}

template <typename Fn>
Fn plugin_fn(void* h, const char* name) {
  void* f = ::dlsym(h, name);
  if (!f) fail(std::string("the CUDA backend (libk3cuda.so) lacks ") + name);
  return reinterpret_cast<Fn>(f);
}

}  // namespace
#endif

const char* kDeviceUsage =
    "  --device D     cpu (default) or cuda[:N]: the backend the model runs on (also K3_DEVICE)\n";

std::shared_ptr<const Ops> backend_from(const Args& a, const char* command) {
  std::string spec, where = "--device";
  if (auto d = a.get("device")) {
    spec = *d;
  } else if (const char* e = std::getenv("K3_DEVICE"); e && *e) {
    spec = e;
    where = "K3_DEVICE";
  }
  if (spec.empty() || spec == "cpu") return nullptr;
  int index = 0;
  if (spec.rfind("cuda", 0) == 0) {
    const std::string rest = spec.substr(4);
    if (!rest.empty()) {
      char* end = nullptr;
      const long v = rest[0] == ':' ? std::strtol(rest.c_str() + 1, &end, 10) : -1;
      if (rest[0] != ':' || rest.size() < 2 || !end || *end || v < 0)
        fail(where + ": expected cpu, cuda or cuda:N, got '" + spec + "'");
      index = int(v);
    }
  } else {
    fail(where + ": expected cpu, cuda or cuda:N, got '" + spec + "'");
  }
#ifdef K3_HAVE_CUDA_PLUGIN
  std::string why;
  void* h = cuda_plugin(&why);
  if (!h) fail(where + " " + spec + ": " + why);
  std::shared_ptr<const Ops> ops;
  std::string error;
  if (plugin_fn<cuda::PluginOpenFn>(h, "k3_cuda_plugin_open")(cuda::kPluginAbi, index, &ops, &error) != 0) fail(error);
  std::fprintf(stderr, "%s: device %s\n", command, ops->device()->name().c_str());
  return ops;
#else
  fail(where + " " + spec + ": this k3cpp was built without the CUDA backend (no nvcc at build time)");
#endif
}

std::string describe_gpus() {
#ifdef K3_HAVE_CUDA_PLUGIN
  std::string why, out;
  void* h = cuda_plugin(&why);
  if (!h) return "no CUDA backend: " + why;
  auto describe = reinterpret_cast<cuda::PluginDescribeFn>(::dlsym(h, "k3_cuda_plugin_describe"));
  if (!describe || describe(cuda::kPluginAbi, &out) != 0) return "no CUDA backend: libk3cuda.so is from another build";
  return out;
#else
  return "no CUDA backend in this build";
#endif
}

}  // namespace k3::cli
