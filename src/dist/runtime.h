// The MPI process environment of a distributed command (`mpirun -np N k3cpp train ... --dp N`):
// MPI_Init_thread (funneled: only the main thread calls MPI; OpenMP threads compute; or serialized) on
// construction, MPI_Finalize on destruction. Commands that run without --dp / --ep never
// initialise MPI.
#pragma once
#include <string>

namespace k3::dist {

class Runtime {
 public:
  // serialized: any one thread at a time may call MPI (MPI_THREAD_SERIALIZED), for `serve --ep`,
  // whose engine thread, not the main one, runs the collectives; otherwise funneled.
  explicit Runtime(bool serialized = false);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ranks of this job on this machine (OMPI_COMM_WORLD_LOCAL_SIZE; 1 when unknown).
  int local_size() const { return local_size_; }
  // Ends every rank of the job after printing "k3cpp: rank R of N: msg" (MPI_Abort).
  [[noreturn]] void abort(const std::string& msg, int code) const;

 private:
  int rank_ = 0, size_ = 1, local_size_ = 1;
};

// Whether this process was started by mpirun (OpenMPI's or a PMI launcher's environment).
bool launched_by_mpirun();

// Fault injection for the robustness tests: K3_DIST_FAULT="MODE:RANK:N" makes rank RANK, at
// its N-th gradient reduction (1-based, counted in this process), die (MODE kill: SIGKILL
// itself; exit: _exit(7) without MPI_Finalize) or hang (sleep forever, so the others time
// out). Unset: nothing. Called by the data-parallel layer.
void maybe_inject_fault(int rank, const char* point);

}  // namespace k3::dist
