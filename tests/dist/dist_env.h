// Shared by the distributed tests (tests/dist): the MPI runtime of a DistRanks run, and the
// helpers the suites use.
#pragma once
#include <string>

namespace k3::dist {
class Runtime;
}

namespace k3::test {

extern dist::Runtime* g_runtime;  // under mpirun; nullptr when run directly
void or_all_ranks(int mine, int* all);

}  // namespace k3::test
