// core/threads.h: release_idle_threads frees the calling thread's parked OpenMP workers (the
// threads of the process drop by the team's size less one), and OpenMP works after it.
#include <dirent.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/threads.h"

namespace {

int64_t process_threads() {  // entries of /proc/self/task
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int64_t n = 0;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Polls (the freed workers exit on their own) until the count is `want` or 5 s have passed.
int64_t wait_for_threads(int64_t want) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int64_t n = process_threads();
  while (n != want && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = process_threads();
  }
  return n;
}

int team_of(int n) {
  std::atomic<int> seen{0};
#pragma omp parallel num_threads(n)
  seen.fetch_add(1);
  return seen.load();
}

}  // namespace

TEST(Threads, ReleaseIdleThreadsFreesTheCallersParkedTeam) {
  // On a thread of its own, so that no earlier test's team is counted.
  std::thread t([] {
    const int64_t before = process_threads();
    ASSERT_EQ(team_of(3), 3);
    ASSERT_EQ(wait_for_threads(before + 2), before + 2) << "the team's two workers stay parked";
    k3::release_idle_threads();
    EXPECT_EQ(wait_for_threads(before), before) << "the parked workers were not freed";
    EXPECT_EQ(team_of(3), 3);  // a new team after it
    k3::release_idle_threads();
    EXPECT_EQ(wait_for_threads(before), before);
  });
  t.join();
}

TEST(Threads, ReleaseInsideAParallelRegionDoesNothing) {
  std::atomic<int> seen{0};
#pragma omp parallel num_threads(2)
  {
    k3::release_idle_threads();
#pragma omp barrier
    seen.fetch_add(1);
  }
  EXPECT_EQ(seen.load(), 2);
}
