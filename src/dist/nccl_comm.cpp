// NCCL backend (see nccl_comm.h). Compiled only with K3_NCCL.
#ifdef K3_HAVE_NCCL
#include "dist/nccl_comm.h"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace k3::dist {

namespace {

struct NcclRequest : Comm::Request {};  // already complete (see wait)

}  // namespace

NcclComm::NcclComm(MPI_Comm parent, double timeout_s) : mpi_(parent, timeout_s) {
  timeout_s_ = timeout_s;
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices < 1) abort("--backend nccl: no CUDA device is visible to this rank", 5);
  int local = 0;
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) local = std::atoi(l);
  cuda_check(cudaSetDevice(local % devices), "cudaSetDevice");
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  ncclUniqueId id;
  if (mpi_.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  mpi_.bcast(&id, sizeof id, 0, "nccl.bootstrap");
  nccl_check(ncclCommInitRank(&nccl_, mpi_.size(), id, mpi_.rank()), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  if (nccl_) ncclCommDestroy(nccl_);
  for (char* b : dbuf_)
    if (b) cudaFree(b);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclComm::abort(const std::string& msg, int code) {
  if (nccl_) ncclCommAbort(nccl_);
  nccl_ = nullptr;
  mpi_.abort(msg, code);
}

void NcclComm::cuda_check(cudaError_t e, const std::string& label) {
  if (e != cudaSuccess) abort("CUDA error in '" + label + "': " + cudaGetErrorString(e), 5);
}

void NcclComm::nccl_check(ncclResult_t r, const std::string& label) {
  if (r != ncclSuccess && r != ncclInProgress) abort("NCCL error in '" + label + "': " + ncclGetErrorString(r), 5);
}

char* NcclComm::device_buffer(int which, size_t bytes) {
  if (dcap_[which] < bytes) {
    if (dbuf_[which]) cuda_check(cudaFree(dbuf_[which]), "cudaFree");
    dbuf_[which] = nullptr;
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&dbuf_[which]), bytes), "cudaMalloc");
    dcap_[which] = bytes;
  }
  return dbuf_[which];
}

void NcclComm::sync(const std::string& label) {
  cuda_check(cudaEventRecord(done_, stream_), label);
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_check(q, label);
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(nccl_, &async), label);
    nccl_check(async, label);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout_s_ > 0 && waited > timeout_s_)
      abort("collective '" + label + "' did not complete within the timeout (--comm-timeout): another rank is stuck "
            "or has died; aborting the job",
            4);
    timespec ts{0, 50000};
    ::nanosleep(&ts, nullptr);
  }
}

Comm::RequestPtr NcclComm::ialltoallv(const void* send, const int64_t* scounts, const int64_t* sdispls, void* recv,
                                      const int64_t* rcounts, const int64_t* rdispls, const std::string& label) {
  const int n = size(), me = rank();
  size_t send_end = 0, recv_end = 0;
  int64_t to_peers = 0;
  for (int p = 0; p < n; ++p) {
    send_end = std::max(send_end, size_t(sdispls[p] + scounts[p]));
    recv_end = std::max(recv_end, size_t(rdispls[p] + rcounts[p]));
    if (p != me) to_peers += scounts[p];
  }
  count(label, to_peers);
  char* ds = device_buffer(0, std::max<size_t>(send_end, 1));
  char* dr = device_buffer(1, std::max<size_t>(recv_end, 1));
  cuda_check(cudaMemcpyAsync(ds, send, send_end, cudaMemcpyHostToDevice, stream_), label);
  nccl_check(ncclGroupStart(), label);
  for (int p = 0; p < n; ++p) {
    if (scounts[p] > 0) nccl_check(ncclSend(ds + sdispls[p], size_t(scounts[p]), ncclUint8, p, nccl_, stream_), label);
    if (rcounts[p] > 0) nccl_check(ncclRecv(dr + rdispls[p], size_t(rcounts[p]), ncclUint8, p, nccl_, stream_), label);
  }
  nccl_check(ncclGroupEnd(), label);
  cuda_check(cudaMemcpyAsync(recv, dr, recv_end, cudaMemcpyDeviceToHost, stream_), label);
  sync(label);
  return std::make_unique<NcclRequest>();
}

// The staging buffers are reused by the next call, so ialltoallv completes before returning
// (one exchange in flight at a time) and there is nothing left to wait for.
void NcclComm::wait(RequestPtr& r) { r.reset(); }
// So an overlapped reduction (data_parallel.h) runs each bucket's exchange, blocking, when it
// posts it: correct, but nothing overlaps the backward on this backend.
bool NcclComm::test(RequestPtr& r) {
  r.reset();
  return true;
}

void NcclComm::allgatherv(const void* send, void* recv, const int64_t* counts, const int64_t* displs,
                          const std::string& label) {
  const int n = size(), me = rank();
  size_t end = 0;
  for (int p = 0; p < n; ++p) end = std::max(end, size_t(displs[p] + counts[p]));
  count(label, counts[me] * (n - 1));
  char* d = device_buffer(1, std::max<size_t>(end, 1));
  cuda_check(cudaMemcpyAsync(d + displs[me], send, size_t(counts[me]), cudaMemcpyHostToDevice, stream_), label);
  nccl_check(ncclGroupStart(), label);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (counts[me] > 0) nccl_check(ncclSend(d + displs[me], size_t(counts[me]), ncclUint8, p, nccl_, stream_), label);
    if (counts[p] > 0) nccl_check(ncclRecv(d + displs[p], size_t(counts[p]), ncclUint8, p, nccl_, stream_), label);
  }
  nccl_check(ncclGroupEnd(), label);
  for (int p = 0; p < n; ++p)
    if (p != me && counts[p] > 0)
      cuda_check(cudaMemcpyAsync(static_cast<char*>(recv) + displs[p], d + displs[p], size_t(counts[p]),
                                 cudaMemcpyDeviceToHost, stream_),
                 label);
  sync(label);
  if (send != static_cast<char*>(recv) + displs[me] && counts[me] > 0)
    std::memcpy(static_cast<char*>(recv) + displs[me], send, size_t(counts[me]));
}

void NcclComm::bcast(void* data, int64_t bytes, int root, const std::string& label) {
  count(label, rank() == root ? bytes * (size() - 1) : 0);
  if (bytes <= 0) return;
  char* d = device_buffer(1, size_t(bytes));
  if (rank() == root) cuda_check(cudaMemcpyAsync(d, data, size_t(bytes), cudaMemcpyHostToDevice, stream_), label);
  nccl_check(ncclBroadcast(d, d, size_t(bytes), ncclUint8, root, nccl_, stream_), label);
  cuda_check(cudaMemcpyAsync(data, d, size_t(bytes), cudaMemcpyDeviceToHost, stream_), label);
  sync(label);
}

void NcclComm::barrier(const std::string& label) { mpi_.barrier(label); }

}  // namespace k3::dist
#endif  // K3_HAVE_NCCL
