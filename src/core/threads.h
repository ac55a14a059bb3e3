// Threading policy in one place: OpenMP for our loops; OpenBLAS (OpenMP build) follows the
// same count. Count comes from --threads, else K3_THREADS, else OMP_NUM_THREADS, else cores.
#pragma once

namespace k3 {
void set_num_threads(int n);  // n <= 0: use the environment / default
int num_threads();
}  // namespace k3
