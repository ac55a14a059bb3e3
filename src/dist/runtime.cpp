// MPI process environment and fault injection (see runtime.h).
#include "dist/runtime.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace k3::dist {

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

Runtime::Runtime(bool serialized) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    const int level = serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED;
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, level, &provided) != MPI_SUCCESS)
      fail("MPI_Init_thread failed (is OpenMPI installed and the job started with mpirun?)");
    if (provided < level)
      fail(std::string("MPI does not provide ") + (serialized ? "MPI_THREAD_SERIALIZED" : "MPI_THREAD_FUNNELED"));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local_size_ = std::max(1, std::atoi(l));
}

Runtime::~Runtime() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

void Runtime::abort(const std::string& msg, int code) const {
  std::fprintf(stderr, "k3cpp: rank %d of %d: %s\n", rank_, size_, msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void maybe_inject_fault(int rank, const char* point) {
  static const char* spec = std::getenv("K3_DIST_FAULT");
  static int calls = 0;
  if (!spec || std::strcmp(point, "grad.reduce") != 0) return;
  char mode[16] = {0};
  int r = -1, n = -1;
  if (std::sscanf(spec, "%15[a-z]:%d:%d", mode, &r, &n) != 3) {
    std::fprintf(stderr, "k3cpp: K3_DIST_FAULT='%s': expected MODE:RANK:N (MODE kill, exit or hang)\n", spec);
    std::_Exit(2);
  }
  if (r != rank || ++calls != n) return;
  std::fprintf(stderr, "k3cpp: rank %d: K3_DIST_FAULT: %s at gradient reduction %d\n", rank, mode, n);
  std::fflush(stderr);
  if (!std::strcmp(mode, "kill")) ::raise(SIGKILL);
  if (!std::strcmp(mode, "exit")) std::_Exit(7);
  if (!std::strcmp(mode, "hang"))
    for (;;) ::pause();
}

}  // namespace k3::dist
