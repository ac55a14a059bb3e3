// test_dist's main: under mpirun (the DistRanks suites, ctest dist_np1/2/4) MPI is initialised
// and every rank runs the same tests, with only rank 0's GoogleTest output printed; run
// directly (the DistJobs suite, ctest dist_failures) it starts mpirun jobs itself and never
// initialises MPI.
#include <gtest/gtest.h>

#include <memory>

#include "dist/runtime.h"
#include "dist_env.h"

namespace k3::test {
dist::Runtime* g_runtime = nullptr;
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<k3::dist::Runtime> rt;
  if (k3::dist::launched_by_mpirun()) {
    rt = std::make_unique<k3::dist::Runtime>();
    k3::test::g_runtime = rt.get();
    if (rt->rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
  }
  int rc = RUN_ALL_TESTS();
  if (rt && rt->size() > 1) {
    // Every rank's verdict: the job fails when any rank's tests failed.
    int all = 0;
    k3::test::or_all_ranks(rc, &all);
    rc = all;
  }
  return rc;
}
