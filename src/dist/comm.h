// k3cpp's distributed layer (src/dist): the transports behind train/parallel.h's DataParallel.
//
// Comm is the one interface a backend implements: a few collectives on raw bytes (all-to-all
// with per-peer counts, all-gather with per-rank counts, broadcast, barrier), each bounded by
// a timeout, each counted. Everything else (the fixed-order gradient reduction, the exact
// integer all-reduce, ZeRO-1's parameter gather) is built from these in data_parallel.cpp, so
// every backend sums in the same order and the byte counts mean the same thing.
//  - MpiComm (mpi_comm.h): MPI (Debian's OpenMPI), the reference backend; always built.
//  - NcclComm (nccl_comm.h): NCCL over CUDA, built only with K3_NCCL (CMake finds CUDA and NCCL);
//    host buffers are staged through device memory. MPI bootstraps it (rank 0's unique id).
//
// Byte counts: per label, the calls and the bytes this rank hands the transport for delivery
// to OTHER ranks (its own piece of an all-to-all stays local and is not counted): an
// all-to-all counts the sum of its send counts to peers; an all-gather its own block times
// (ranks - 1); a broadcast, on the root, the payload times (ranks - 1). That is the volume a
// direct or ring algorithm puts on the wire per rank (a tree broadcast spreads the root's
// share over the ranks that forward it).
//
// Failure: every wait polls with a deadline (timeout_s); a collective that has not completed
// by then (a peer stuck, or gone without the launcher noticing) prints one line naming the
// rank, the collective and the timeout, and aborts the whole job (MPI_Abort), as does any
// transport error. A rank that dies is normally noticed first by mpirun, which kills the others
// (OpenMPI's default); tests/dist checks both.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace k3::dist {

struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;  // to other ranks (see above)
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // A pending non-blocking collective; wait() completes it (or aborts the job at the timeout).
  struct Request {
    virtual ~Request() = default;
  };
  using RequestPtr = std::unique_ptr<Request>;

  // All-to-all with per-peer byte counts and displacements (relative to send / recv). Each
  // count and displacement must fit an int (callers cut large exchanges into buckets).
  virtual RequestPtr ialltoallv(const void* send, const int64_t* scounts, const int64_t* sdispls, void* recv,
                                const int64_t* rcounts, const int64_t* rdispls, const std::string& label) = 0;
  virtual void wait(RequestPtr& r) = 0;
  // Whether r has completed (then r is released); never waits (a transport error still aborts
  // the job). Polling it is what moves a non-blocking exchange on while the caller computes.
  virtual bool test(RequestPtr& r) = 0;
  // recv gets every rank's block: rank q's counts[q] bytes at displs[q]; this rank's comes from
  // send (counts[rank()] bytes; send == recv + displs[rank()] is allowed: in place).
  virtual void allgatherv(const void* send, void* recv, const int64_t* counts, const int64_t* displs,
                          const std::string& label) = 0;
  virtual void bcast(void* data, int64_t bytes, int root, const std::string& label) = 0;
  virtual void barrier(const std::string& label) = 0;
  // Prints "k3cpp: rank R of N: <msg>" on stderr and ends every rank of the job.
  [[noreturn]] virtual void abort(const std::string& msg, int code) = 0;

  double timeout_s() const { return timeout_s_; }
  void set_timeout(double s) { timeout_s_ = s; }
  const std::map<std::string, CollectiveStats>& stats() const { return stats_; }
  void reset_stats() { stats_.clear(); }

 protected:
  void count(const std::string& label, int64_t bytes_to_peers) {
    CollectiveStats& s = stats_[label];
    s.calls++, s.bytes_sent += bytes_to_peers;
  }
  double timeout_s_ = 600;

 private:
  std::map<std::string, CollectiveStats> stats_;
};

// The world communicator of the requested backend ("mpi" or "nccl"; "nccl" is an error in a
// build without K3_NCCL). MPI must be initialised (dist/runtime.h).
std::unique_ptr<Comm> make_comm(const std::string& backend, double timeout_s);
// Whether this build has the NCCL backend.
bool have_nccl();

}  // namespace k3::dist
