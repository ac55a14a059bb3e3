// The reading ring under memory-limited inference's three readers: the expert streamer
// (infer/weight_stream.h, an expert per cache slot), the trunk ring (trunk_ring.h, a decoder
// layer's matrices per slot) and the head streamer (head_stream.h, a block of lm_head rows per
// buffer). It owns what the three had each written for themselves:
//  - the checkpoint files opened for reads: O_DIRECT where the file system allows it (every
//    read widened to 4096-byte boundaries), else buffered pread + fadvise(DONTNEED);
//  - one arena of equal slots (anonymous mmap, 2 MiB aligned, MADV_HUGEPAGE, faulted in at
//    once so the budget shows in RssAnon at load), plus an optional tail for reads the owner
//    makes on its own thread (the head streamer's embedding rows);
//  - one I/O thread reading the queued items in order, one at a time, with the lock, the
//    conditions, the count of items queued or being read, the exclusion of calls (a forward
//    at a time) and the read statistics (pread calls, bytes from disk, seconds in pread,
//    seconds the compute thread waited).
// The owner says what an item is: `read(item)` runs on the I/O thread without the lock and
// throws k3::Error when a read fails or comes back short; `done(item, error)` runs on the I/O
// thread with the lock held after each read ("" on success). An item's bookkeeping must not
// change while it is queued or being read (the owner pins it), so `read` may look at it without
// the lock. Members named *_locked are called with the lock held (lock()); the others take it.
// Declare the ring as the owner's last member: it is destroyed first, so the I/O thread has
// stopped before anything its callbacks use goes away.
#pragma once
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "infer/direct_io.h"

namespace k3 {

struct RingReadStats {
  int64_t reads = 0;           // pread calls
  uint64_t device_bytes = 0;   // bytes read from the files (payload + alignment widening + gaps)
  double io_seconds = 0;       // inside pread
  double wait_seconds = 0;     // the compute thread waiting for reads
};

class ReadingRing {
 public:
  using ReadFn = std::function<void(int64_t item)>;
  using DoneFn = std::function<void(int64_t item, const std::string& error)>;

  ReadingRing() = default;
  ~ReadingRing();  // stops the I/O thread (queued reads are dropped), closes the files, unmaps the arena
  ReadingRing(const ReadingRing&) = delete;
  ReadingRing& operator=(const ReadingRing&) = delete;

  // Setup, before start(). open_files: infer/direct_io.h open_for_reads (require_direct: a
  // refused O_DIRECT is a k3::Error; buffered_asked: the mode line says it was asked for).
  void open_files(const std::vector<std::string>& files, bool direct, bool require_direct, bool buffered_asked);
  // `slots` x `slot_bytes` followed by `tail_bytes`; `what` names the arena in an error.
  void map_arena(int64_t slots, uint64_t slot_bytes, uint64_t tail_bytes, const std::string& what);
  void start(ReadFn read, DoneFn done);

  bool direct() const { return direct_; }
  const std::string& io_mode() const { return io_mode_; }
  const std::string& file(int i) const { return files_[size_t(i)]; }
  uint8_t* slot(int64_t i) const { return arena_ + uint64_t(i) * slot_bytes_; }
  uint8_t* tail() const { return arena_ + uint64_t(slots_) * slot_bytes_; }
  int64_t slots() const { return slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t arena_bytes() const { return arena_bytes_; }

  // One widened read (direct_io.h read_run) of [start, start + len) of file `file` into dst,
  // the first `need` bytes required; counted in the statistics, its bytes into *bytes (the
  // owner's counter, guarded by this lock) or, when null, device_bytes. Takes the lock only
  // to count; any thread.
  void read(int file, uint8_t* dst, uint64_t start, uint64_t len, uint64_t need, const PreadHook& hook,
            const std::function<std::string(uint64_t got)>& what, uint64_t* bytes = nullptr);

  std::unique_lock<std::mutex> lock() const { return std::unique_lock<std::mutex>(mu_); }

  // The I/O thread's queue. queue_locked: item read after those queued before it.
  // drop_queued_locked: the items not started yet, taken back (never read, never done).
  void queue_locked(int64_t item);
  std::vector<int64_t> drop_queued_locked();
  int64_t outstanding_locked() const { return outstanding_; }  // queued or being read

  // Waits for a read to finish until `ready()` holds. timed: the wait counts in wait_seconds
  // (the compute thread waiting for bytes); untimed: waits of bookkeeping (a call's cleanup).
  template <class Pred>
  void wait_locked(std::unique_lock<std::mutex>& lk, Pred ready) {
    cv_done_.wait(lk, ready);
  }
  template <class Pred>
  void wait_timed_locked(std::unique_lock<std::mutex>& lk, Pred ready) {
    const double t0 = steady_seconds();
    cv_done_.wait(lk, ready);
    st_.wait_seconds += steady_seconds() - t0;
  }
  void wait_next_done_locked(std::unique_lock<std::mutex>& lk) { cv_done_.wait(lk); }  // any read's end (or spurious)
  void wait_idle();  // until nothing is queued or being read

  // Calls: one forward at a time uses the owner (sessions of a server on several threads).
  // enter_call waits for another thread's call to end and makes this thread the owner.
  void enter_call_locked(std::unique_lock<std::mutex>& lk);
  void leave_call_locked();
  bool in_call_locked() const { return in_call_; }
  bool call_is_mine_locked() const { return in_call_ && owner_ == std::this_thread::get_id(); }

  RingReadStats& stats_locked() { return st_; }
  const RingReadStats& stats_locked() const { return st_; }

  // For owners whose slots have a state S::{Empty, Reading, Ready}, an `error` and `ahead`
  // (the read was started by a read-ahead): waits until slot s (queued as item `index`) is
  // read; a failed read-ahead is read once more, now (a transient fault on a prefetch costs a
  // retry, not the call). A failure is thrown with the slot emptied (S{}), so the next acquire
  // reads it again; never served. Returns whether the slot was ready on entry (a hit).
  template <class S>
  bool await_slot_locked(std::unique_lock<std::mutex>& lk, S& s, int64_t index) {
    const bool hit = s.state != S::Reading;
    auto read_done = [&] { return s.state != S::Reading; };
    if (!hit) wait_timed_locked(lk, read_done);
    if (!s.error.empty() && s.ahead) {
      s.error.clear();
      s.ahead = false;
      s.state = S::Reading;
      queue_locked(index);
      wait_timed_locked(lk, read_done);
    }
    if (!s.error.empty()) {
      const std::string e = s.error;
      s = S{};
      fail(e);
    }
    return hit;
  }

 private:
  void io_loop();

  std::vector<std::string> files_;
  std::vector<int> fds_;
  bool direct_ = false;
  std::string io_mode_;
  uint8_t* arena_ = nullptr;
  int64_t slots_ = 0;
  uint64_t slot_bytes_ = 0, arena_bytes_ = 0;
  ReadFn read_;
  DoneFn done_;

  mutable std::mutex mu_;
  std::condition_variable cv_io_, cv_done_, cv_call_;
  bool stop_ = false, in_call_ = false;
  std::thread::id owner_;
  std::deque<int64_t> queue_;
  int64_t outstanding_ = 0;
  RingReadStats st_;
  std::thread io_;
};

}  // namespace k3
