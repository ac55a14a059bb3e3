// MPI backend (see mpi_comm.h).
#include "dist/mpi_comm.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace k3::dist {

namespace {

struct MpiRequest : Comm::Request {
  MPI_Request req = MPI_REQUEST_NULL;
  std::string label;
  std::vector<int> counts;  // scounts, sdispls, rcounts, rdispls (alive until completion)
};

int to_int(int64_t v, const std::string& label) {
  K3_ASSERT(v >= 0 && v <= INT_MAX, label + ": a count or displacement beyond 2^31 bytes (cut it into buckets)");
  return int(v);
}

}  // namespace

MpiComm::MpiComm(MPI_Comm parent, double timeout_s) {
  timeout_s_ = timeout_s;
  MPI_Comm_dup(parent, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiComm::~MpiComm() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::abort(const std::string& msg, int code) {
  std::fprintf(stderr, "k3cpp: rank %d of %d: %s\n", rank_, size_, msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void MpiComm::check(int rc, const std::string& label) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  abort("MPI error in collective '" + label + "': " + std::string(buf, size_t(len)) +
            " (a peer rank failed or exited); aborting the job",
        3);
}

// Polls until done: spins for the first ~100 polls, then sleeps 20 us growing to 1 ms between
// polls. Past the deadline the job is aborted with the collective's name.
void MpiComm::wait_request(MPI_Request& r, const std::string& label) {
  const auto t0 = std::chrono::steady_clock::now();
  long sleep_ns = 20000;
  for (int polls = 0;; ++polls) {
    int done = 0;
    check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), label);
    if (done) return;
    if (polls < 100) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout_s_ > 0 && waited > timeout_s_) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.0f", timeout_s_);
      abort("collective '" + label + "' did not complete within " + buf +
                " s (--comm-timeout): another rank is stuck or has died; aborting the job",
            4);
    }
    timespec ts{0, sleep_ns};
    ::nanosleep(&ts, nullptr);
    sleep_ns = std::min(sleep_ns * 2, 1000000L);
  }
}

Comm::RequestPtr MpiComm::ialltoallv(const void* send, const int64_t* scounts, const int64_t* sdispls, void* recv,
                                     const int64_t* rcounts, const int64_t* rdispls, const std::string& label) {
  auto r = std::make_unique<MpiRequest>();
  r->label = label;
  const int n = size_;
  r->counts.resize(size_t(4 * n));
  int64_t to_peers = 0;
  for (int p = 0; p < n; ++p) {
    r->counts[size_t(p)] = to_int(scounts[p], label);
    r->counts[size_t(n + p)] = to_int(sdispls[p], label);
    r->counts[size_t(2 * n + p)] = to_int(rcounts[p], label);
    r->counts[size_t(3 * n + p)] = to_int(rdispls[p], label);
    if (p != rank_) to_peers += scounts[p];
  }
  count(label, to_peers);
  int* c = r->counts.data();
  check(MPI_Ialltoallv(send, c, c + n, MPI_BYTE, recv, c + 2 * n, c + 3 * n, MPI_BYTE, comm_, &r->req), label);
  return r;
}

void MpiComm::wait(RequestPtr& r) {
  auto* m = static_cast<MpiRequest*>(r.get());
  wait_request(m->req, m->label);
  r.reset();
}

bool MpiComm::test(RequestPtr& r) {
  auto* m = static_cast<MpiRequest*>(r.get());
  int done = 0;
  check(MPI_Test(&m->req, &done, MPI_STATUS_IGNORE), m->label);
  if (done) r.reset();
  return done != 0;
}

void MpiComm::allgatherv(const void* send, void* recv, const int64_t* counts, const int64_t* displs,
                         const std::string& label) {
  const size_t nr = static_cast<size_t>(size_);
  std::vector<int> c(nr), d(nr);
  for (int p = 0; p < size_; ++p) c[size_t(p)] = to_int(counts[p], label), d[size_t(p)] = to_int(displs[p], label);
  count(label, counts[rank_] * (size_ - 1));
  const bool in_place = send == static_cast<const char*>(recv) + displs[rank_];
  MPI_Request req;
  check(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, c[size_t(rank_)], MPI_BYTE, recv, c.data(), d.data(), MPI_BYTE,
                        comm_, &req),
        label);
  wait_request(req, label);
}

void MpiComm::bcast(void* data, int64_t bytes, int root, const std::string& label) {
  count(label, rank_ == root ? bytes * (size_ - 1) : 0);
  char* p = static_cast<char*>(data);
  for (int64_t off = 0; off < bytes || (bytes == 0 && off == 0); off += INT_MAX / 2) {
    const int n = int(std::min<int64_t>(bytes - off, INT_MAX / 2));
    MPI_Request req;
    check(MPI_Ibcast(p + off, n, MPI_BYTE, root, comm_, &req), label);
    wait_request(req, label);
    if (bytes == 0) break;
  }
}

void MpiComm::barrier(const std::string& label) {
  count(label, 0);
  MPI_Request req;
  check(MPI_Ibarrier(comm_, &req), label);
  wait_request(req, label);
}

}  // namespace k3::dist
