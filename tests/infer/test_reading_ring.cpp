// The reading ring under the three memory-limited readers (infer/reading_ring.h), on its own:
// queued items read in order into their slots with every pread counted; a failed read reaches
// `done` with an error naming what was read, and the items not started can be taken back; the
// slot wait retries a failed read-ahead once and throws (slot emptied) when the retry fails
// too, or when the read was not a read-ahead; one call at a time across threads. The readers'
// own behaviour (bitwise logits, faults, truncated files) is in test_weight_stream.cpp,
// test_trunk_ring.cpp and test_head_stream.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_run.h"
#include "core/error.h"
#include "infer/reading_ring.h"

using namespace k3;

namespace {

constexpr uint64_t kSlot = 4096;

// A file of n 4096-byte blocks, block i filled with byte (i * 37 + 11).
std::string write_blocks(const test::TempDir& d, int n) {
  const std::string path = d.path + "/blocks.bin";
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < n; ++i) {
    const std::string block(kSlot, char(uint8_t(i * 37 + 11)));
    f.write(block.data(), std::streamsize(block.size()));
  }
  return path;
}

bool slot_holds_block(const ReadingRing& r, int64_t slot, int block) {
  const uint8_t* p = r.slot(slot);
  for (uint64_t i = 0; i < kSlot; ++i)
    if (p[i] != uint8_t(block * 37 + 11)) return false;
  return true;
}

std::string what_block(int64_t item) {
  return "block " + std::to_string(item);
}

struct Slot {  // what await_slot_locked expects of an owner's slot
  enum State { Empty, Reading, Ready } state = Empty;
  bool ahead = false;
  std::string error;
};

}  // namespace

TEST(ReadingRing, ReadsQueuedItemsInOrderAndCountsTheirBytes) {
  test::TempDir d;
  const std::string file = write_blocks(d, 4);
  std::vector<int64_t> done_order;
  ReadingRing ring;
  ring.open_files({file}, false, false, true);
  EXPECT_NE(ring.io_mode().find("buffered"), std::string::npos) << ring.io_mode();
  ring.map_arena(4, kSlot, 0, "the test arena");
  ring.start(
      [&](int64_t item) {  // slot `item` gets block 3 - item
        ring.read(0, ring.slot(item), uint64_t(3 - item) * kSlot, kSlot, kSlot, {},
                  [&](uint64_t) { return what_block(item); });
      },
      [&](int64_t item, const std::string& error) {
        EXPECT_EQ(error, "");
        done_order.push_back(item);
      });
  {
    auto lk = ring.lock();
    for (int64_t i : {2, 0, 3, 1}) ring.queue_locked(i);
  }
  ring.wait_idle();
  auto lk = ring.lock();
  EXPECT_EQ(done_order, (std::vector<int64_t>{2, 0, 3, 1}));
  for (int64_t s = 0; s < 4; ++s) EXPECT_TRUE(slot_holds_block(ring, s, int(3 - s))) << s;
  EXPECT_EQ(ring.stats_locked().reads, 4);
  EXPECT_EQ(ring.stats_locked().device_bytes, 4 * kSlot);
  EXPECT_EQ(ring.outstanding_locked(), 0);
  EXPECT_EQ(ring.arena_bytes() % (uint64_t(2) << 20), 0u);  // whole 2 MiB pages
}

TEST(ReadingRing, AFailedReadReachesDoneAndQueuedItemsCanBeTakenBack) {
  test::TempDir d;
  const std::string file = write_blocks(d, 8);
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  std::atomic<bool> started{false};
  std::vector<std::pair<int64_t, std::string>> done;
  const PreadHook fail_block_5 = [](int fd, void* buf, size_t n, off_t off) -> ssize_t {
    if (off == off_t(5 * kSlot)) {
      errno = EIO;
      return -1;
    }
    return ::pread(fd, buf, n, off);
  };
  ReadingRing ring;
  ring.open_files({file}, false, false, true);
  ring.map_arena(8, kSlot, kSlot, "the test arena");
  ring.start(
      [&](int64_t item) {
        if (item == 0) {  // the first read waits until the test has taken the queue back
          started = true;
          std::unique_lock<std::mutex> g(gate_mu);
          gate_cv.wait(g, [&] { return open; });
        }
        ring.read(0, ring.slot(item), uint64_t(item) * kSlot, kSlot, kSlot, fail_block_5,
                  [&](uint64_t got) { return what_block(item) + " at +" + std::to_string(got); });
      },
      [&](int64_t item, const std::string& error) { done.emplace_back(item, error); });
  std::vector<int64_t> dropped;
  {
    auto lk = ring.lock();
    for (int64_t i = 0; i < 4; ++i) ring.queue_locked(i);
  }
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // item 0 is being read
  {
    auto lk = ring.lock();
    dropped = ring.drop_queued_locked();
    EXPECT_EQ(ring.outstanding_locked(), 1);
    ring.queue_locked(5);  // fails
    ring.queue_locked(6);
  }
  EXPECT_EQ(dropped, (std::vector<int64_t>{1, 2, 3}));
  {
    std::lock_guard<std::mutex> g(gate_mu);
    open = true;
  }
  gate_cv.notify_all();
  ring.wait_idle();
  auto lk = ring.lock();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0], std::make_pair(int64_t(0), std::string()));
  EXPECT_EQ(done[1].first, 5);
  EXPECT_NE(done[1].second.find("block 5"), std::string::npos) << done[1].second;
  EXPECT_EQ(done[2], std::make_pair(int64_t(6), std::string()));
  EXPECT_TRUE(slot_holds_block(ring, 0, 0));
  EXPECT_TRUE(slot_holds_block(ring, 6, 6));
  // The tail after the slots is the owner's: the reads never touched it.
  for (uint64_t i = 0; i < kSlot; ++i) ASSERT_EQ(ring.tail()[i], 0) << i;
}

TEST(ReadingRing, SlotWaitRetriesAFailedReadAheadOnceAndThrowsOtherwise) {
  test::TempDir d;
  const std::string file = write_blocks(d, 2);
  std::atomic<int> failures_left{1};
  Slot s;
  ReadingRing ring;
  ring.open_files({file}, false, false, true);
  ring.map_arena(1, kSlot, 0, "the test arena");
  ring.start(
      [&](int64_t) {
        if (failures_left.fetch_sub(1) > 0) fail("injected fault reading " + what_block(1));
        ring.read(0, ring.slot(0), kSlot, kSlot, kSlot, {}, [](uint64_t) { return what_block(1); });
      },
      [&](int64_t, const std::string& error) {
        s.state = Slot::Ready;
        s.error = error;
      });
  auto lk = ring.lock();
  // A read-ahead that fails is read again by the wait that needs it.
  s.state = Slot::Reading, s.ahead = true;
  ring.queue_locked(0);
  EXPECT_FALSE(ring.await_slot_locked(lk, s, 0));  // not ready on entry: no hit
  EXPECT_EQ(s.state, Slot::Ready);
  EXPECT_EQ(s.error, "");
  EXPECT_TRUE(slot_holds_block(ring, 0, 1));
  EXPECT_TRUE(ring.await_slot_locked(lk, s, 0));  // ready now: a hit, nothing read
  EXPECT_GT(ring.stats_locked().wait_seconds, 0.0);
  // A failed read the caller itself started is its error, with the slot emptied.
  failures_left = 1;
  s = Slot{};
  s.state = Slot::Reading;
  ring.queue_locked(0);
  try {
    ring.await_slot_locked(lk, s, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected fault reading block 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.state, Slot::Empty);
  EXPECT_EQ(s.error, "");
}

TEST(ReadingRing, OneCallAtATimeAcrossThreads) {
  ReadingRing ring;  // no files, no arena: the call exclusion alone
  std::atomic<int> in_call{0}, most{0}, calls{0};
  auto body = [&] {
    for (int i = 0; i < 50; ++i) {
      {
        auto lk = ring.lock();
        ring.enter_call_locked(lk);
        EXPECT_TRUE(ring.call_is_mine_locked());
      }
      const int now = ++in_call;
      most = std::max(most.load(), now);
      std::this_thread::yield();
      --in_call;
      ++calls;
      auto lk = ring.lock();
      ring.leave_call_locked();
      EXPECT_FALSE(ring.call_is_mine_locked());
    }
  };
  std::thread a(body), b(body);
  a.join(), b.join();
  EXPECT_EQ(calls.load(), 100);
  EXPECT_EQ(most.load(), 1);
}
