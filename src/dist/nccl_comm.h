// The NCCL backend of dist::Comm (see comm.h), built only with K3_NCCL (CUDA and NCCL found by
// CMake). k3cpp computes on the CPU, so each collective stages host buffers through device
// memory: copy in, NCCL on the rank's stream (all-to-all and all-gather as grouped
// ncclSend/ncclRecv, broadcast as ncclBroadcast), copy out, then a deadline-bounded poll of the
// stream's event and of ncclCommGetAsyncError. MPI bootstraps it as in llm.c: rank 0 creates
// the unique id and broadcasts it, every rank calls ncclCommInitRank; barriers go over MPI.
// One GPU per rank (NCCL refuses two ranks on one device): device = local rank modulo the
// visible devices. No GPU exists on the machines this was written on, so this backend is
// compiled there and never run (docs/distributed.md).
#pragma once
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>

#include "dist/comm.h"
#include "dist/mpi_comm.h"

namespace k3::dist {

class NcclComm : public Comm {
 public:
  NcclComm(MPI_Comm parent, double timeout_s);
  ~NcclComm() override;
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::string backend() const override { return "nccl"; }
  RequestPtr ialltoallv(const void* send, const int64_t* scounts, const int64_t* sdispls, void* recv,
                        const int64_t* rcounts, const int64_t* rdispls, const std::string& label) override;
  void wait(RequestPtr& r) override;
  bool test(RequestPtr& r) override;  // always true: ialltoallv has already completed
  void allgatherv(const void* send, void* recv, const int64_t* counts, const int64_t* displs,
                  const std::string& label) override;
  void bcast(void* data, int64_t bytes, int root, const std::string& label) override;
  void barrier(const std::string& label) override;
  [[noreturn]] void abort(const std::string& msg, int code) override;

 private:
  void cuda_check(cudaError_t e, const std::string& label);
  void nccl_check(ncclResult_t r, const std::string& label);
  char* device_buffer(int which, size_t bytes);  // grow-only staging buffers 0 (send), 1 (recv)
  void sync(const std::string& label);            // waits for the stream (deadline-bounded)
  MpiComm mpi_;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  char* dbuf_[2] = {nullptr, nullptr};
  size_t dcap_[2] = {0, 0};
};

}  // namespace k3::dist
