// Runs f with OpenBLAS single-threaded. The post-training models' gemms are small (d 32-128,
// one to a few hundred rows): called outside a parallel region, OpenBLAS (the OpenMP build,
// CMakeLists.txt) splits each over every thread and, on a machine shared with other jobs,
// spends most of the time in sched_yield waiting for the other half (measured on the vision
// RL run: 86 s for a step that takes a few seconds otherwise). Inside an active parallel
// region (omp_in_parallel(): a team of two, one works, one waits at the barrier) its calls run
// on the calling thread. The products are the same: OpenBLAS's threads split the output
// blocks, not the sums. Exceptions are carried out of the region.
#pragma once
#include <exception>

#include <omp.h>

namespace k3 {

template <typename F>
void serial_blas(F&& f) {
  std::exception_ptr err;
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 0) {
      try {
        f();
      } catch (...) {
        err = std::current_exception();
      }
    }
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace k3
