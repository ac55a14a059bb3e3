// The wait for a slot read by an owner's I/O thread, shared by the trunk ring (a layer per
// slot) and the head streamer (a block of lm_head rows per buffer): both keep slots with a
// state (Empty, Reading, Ready), an error and whether a read-ahead started the read, a queue
// of slots for their one I/O thread, and report read failures only to the caller that needs
// the slot. Called with the owner's mutex held through `lk`.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "core/error.h"
#include "infer/direct_io.h"

namespace k3 {

// Queues slot `index` for the I/O thread.
inline void queue_slot_read_locked(int64_t index, std::deque<int64_t>& queue, int64_t& reading,
                                   std::condition_variable& cv_io) {
  queue.push_back(index);
  ++reading;
  cv_io.notify_one();
}

// Waits until slot s (index `index`) is read; a failed read started by a read-ahead is read once
// more, now (a transient fault on a prefetch costs a retry, not the call). A failure is thrown
// with the slot emptied (S{}), so the next acquire reads it again; never served. Returns
// whether the slot was ready on entry (a hit); time spent waiting is added to *wait_seconds.
template <class S>
bool await_slot_locked(std::unique_lock<std::mutex>& lk, S& s, int64_t index, std::deque<int64_t>& queue,
                       int64_t& reading, std::condition_variable& cv_io, std::condition_variable& cv_done,
                       double* wait_seconds) {
  const bool hit = s.state != S::Reading;
  auto wait_read = [&] {
    const double t0 = steady_seconds();
    cv_done.wait(lk, [&] { return s.state != S::Reading; });
    *wait_seconds += steady_seconds() - t0;
  };
  if (!hit) wait_read();
  if (!s.error.empty() && s.ahead) {
    s.error.clear();
    s.ahead = false;
    s.state = S::Reading;
    queue_slot_read_locked(index, queue, reading, cv_io);
    wait_read();
  }
  if (!s.error.empty()) {
    const std::string e = s.error;
    s = S{};
    fail(e);
  }
  return hit;
}

}  // namespace k3
