#include "core/threads.h"

#include <omp.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace k3 {

static int g_threads = 0;

static int env_threads() {
  for (const char* name : {"K3_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      long n = std::strtol(v, &end, 10);
      if (end == v || *end != '\0' || n <= 0 || n > 4096)
        fail(std::string("environment: ") + name + ": expected a positive integer, got '" + v + "'");
      return int(n);
    }
  }
  return omp_get_num_procs();
}

void set_num_threads(int n) {
  g_threads = n > 0 ? n : env_threads();
  omp_set_num_threads(g_threads);  // OpenBLAS's OpenMP build reads the same setting
}

int num_threads() {
  if (g_threads == 0) set_num_threads(0);
  return g_threads;
}

void release_idle_threads() {
  // OpenMP 5.0: libgomp frees the calling thread's pool (and fails, harmlessly, inside a team).
  if (omp_in_parallel()) return;
  omp_pause_resource_all(omp_pause_soft);
}

}  // namespace k3
