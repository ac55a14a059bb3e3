// Backend selection (see comm.h).
#include "dist/comm.h"

#include "core/error.h"
#include "dist/mpi_comm.h"
#ifdef K3_HAVE_NCCL
#include "dist/nccl_comm.h"
#endif

namespace k3::dist {

bool have_nccl() {
#ifdef K3_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Comm> make_comm(const std::string& backend, double timeout_s) {
  if (backend == "mpi") return std::make_unique<MpiComm>(MPI_COMM_WORLD, timeout_s);
  if (backend == "nccl") {
#ifdef K3_HAVE_NCCL
    return std::make_unique<NcclComm>(MPI_COMM_WORLD, timeout_s);
#else
    fail("--backend nccl: this k3cpp was built without NCCL (configure with CUDA and NCCL present, -DK3_NCCL=ON)");
#endif
  }
  fail("--backend: expected mpi or nccl, got '" + backend + "'");
}

}  // namespace k3::dist
