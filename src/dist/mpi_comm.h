// The MPI backend of dist::Comm (see comm.h): MPI_Ialltoallv, MPI_Iallgatherv, MPI_Ibcast and
// MPI_Ibarrier on a duplicate of the world communicator with MPI_ERRORS_RETURN, each completed
// by polling MPI_Testall with a deadline and a short sleep between polls (so ranks that wait
// for a slower one leave the cores to it: the tests oversubscribe a 2-core machine).
#pragma once
#include <mpi.h>

#include "dist/comm.h"

namespace k3::dist {

class MpiComm : public Comm {
 public:
  explicit MpiComm(MPI_Comm parent, double timeout_s);
  ~MpiComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  RequestPtr ialltoallv(const void* send, const int64_t* scounts, const int64_t* sdispls, void* recv,
                        const int64_t* rcounts, const int64_t* rdispls, const std::string& label) override;
  void wait(RequestPtr& r) override;
  bool test(RequestPtr& r) override;
  void allgatherv(const void* send, void* recv, const int64_t* counts, const int64_t* displs,
                  const std::string& label) override;
  void bcast(void* data, int64_t bytes, int root, const std::string& label) override;
  void barrier(const std::string& label) override;
  [[noreturn]] void abort(const std::string& msg, int code) override;
  MPI_Comm handle() const { return comm_; }

 private:
  void check(int rc, const std::string& label);
  void wait_request(MPI_Request& r, const std::string& label);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace k3::dist
