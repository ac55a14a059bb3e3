#include "kernels/blas_core.h"

#include <cblas.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <mutex>

#include "core/simd_target.h"

// Exported by OpenBLAS's DYNAMIC_ARCH builds (driver/others/dynamic.c): _quit forgets the
// chosen kernel table, _init chooses again, reading OPENBLAS_CORETYPE. Weak: absent elsewhere.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace k3 {
namespace {

// Whether the environment the process started with names OPENBLAS_CORETYPE (the user's
// choice). getenv cannot tell once blas_choose_core has set the variable for the re-selection.
bool started_with_coretype() {
  std::ifstream f("/proc/self/environ", std::ios::binary);
  const std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  static const char kKey[] = "OPENBLAS_CORETYPE=";
  for (size_t p = 0; p < env.size();) {
    if (env.compare(p, sizeof(kKey) - 1, kKey) == 0) return true;
    const size_t z = env.find('\0', p);
    if (z == std::string::npos) break;
    p = z + 1;
  }
  return false;
}

}  // namespace

std::string blas_core_name() {
  const char* n = openblas_get_corename();
  return n ? n : "";
}

bool blas_core_is_avx512(const std::string& name) {
  return name == "SkylakeX" || name == "Cooperlake" || name == "SapphireRapids";
}

bool blas_core_selectable() {
  static const bool selectable = gotoblas_dynamic_init && gotoblas_dynamic_quit && !started_with_coretype();
  return selectable;
}

void blas_choose_core() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!blas_core_selectable()) return;
    // OpenBLAS picks an AVX-512 set only on a CPU that has it.
    const std::string core = blas_core_name();
    if (simd_avx512_allowed() || !blas_core_is_avx512(core)) return;
    const char* want = "Haswell";
    setenv("OPENBLAS_CORETYPE", want, 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    if (blas_core_name() != want) {  // this OpenBLAS lacks that set: back to its own choice
      setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
      gotoblas_dynamic_quit();
      gotoblas_dynamic_init();
    }
  });
}

}  // namespace k3
