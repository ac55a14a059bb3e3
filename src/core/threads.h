// Threading policy in one place: OpenMP for our loops; OpenBLAS (OpenMP build) follows the
// same count. Count comes from --threads, else K3_THREADS, else OMP_NUM_THREADS, else cores.
#pragma once

namespace k3 {
void set_num_threads(int n);  // n <= 0: use the environment / default
int num_threads();
// Frees the calling thread's idle OpenMP team: libgomp keeps a thread's workers parked after its
// parallel regions end. Call it on a thread whose parallel regions are over before another
// thread starts a team of its own (the serving engine's): with both teams' threads counted
// against the cores, libgomp stops spinning between parallel regions and every region wakes
// its workers from sleep, which made the engine's decode steps 1.5-1.8x slower after the model
// had been loaded on the main thread (docs/serving.md). A later parallel region on the calling
// thread starts a new team. Does nothing inside a parallel region.
void release_idle_threads();
}  // namespace k3
