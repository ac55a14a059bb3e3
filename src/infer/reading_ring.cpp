// The reading ring under the expert streamer, the trunk ring and the head streamer (see
// reading_ring.h).
#include "infer/reading_ring.h"

#include <unistd.h>

namespace k3 {

ReadingRing::~ReadingRing() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_io_.notify_all();
  if (io_.joinable()) io_.join();
  for (int fd : fds_) ::close(fd);
  if (arena_) unmap_owned_arena(arena_, arena_bytes_);
}

void ReadingRing::open_files(const std::vector<std::string>& files, bool direct, bool require_direct,
                             bool buffered_asked) {
  K3_ASSERT(fds_.empty(), "reading ring: files opened twice");
  files_ = files;
  open_for_reads(files_, direct, require_direct, buffered_asked, &fds_, &direct_, &io_mode_);
}

void ReadingRing::map_arena(int64_t slots, uint64_t slot_bytes, uint64_t tail_bytes, const std::string& what) {
  K3_ASSERT(!arena_ && slots >= 0, "reading ring: arena mapped twice");
  slots_ = slots;
  slot_bytes_ = slot_bytes;
  arena_ = map_owned_arena(uint64_t(slots) * slot_bytes + tail_bytes, what, &arena_bytes_);
}

void ReadingRing::start(ReadFn read, DoneFn done) {
  K3_ASSERT(!io_.joinable(), "reading ring: started twice");
  read_ = std::move(read);
  done_ = std::move(done);
  io_ = std::thread([this] { io_loop(); });
}

void ReadingRing::read(int file, uint8_t* dst, uint64_t start, uint64_t len, uint64_t need, const PreadHook& hook,
                       const std::function<std::string(uint64_t got)>& what, uint64_t* bytes) {
  auto account = [&](double seconds, ssize_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    st_.io_seconds += seconds;
    ++st_.reads;
    if (n > 0) *(bytes ? bytes : &st_.device_bytes) += uint64_t(n);
  };
  read_run(fds_[size_t(file)], dst, start, len, need, direct_, hook, account, what);
}

void ReadingRing::queue_locked(int64_t item) {
  queue_.push_back(item);
  ++outstanding_;
  cv_io_.notify_one();
}

std::vector<int64_t> ReadingRing::drop_queued_locked() {
  std::vector<int64_t> dropped(queue_.begin(), queue_.end());
  outstanding_ -= int64_t(dropped.size());
  queue_.clear();
  return dropped;
}

void ReadingRing::wait_idle() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return outstanding_ == 0; });
}

void ReadingRing::enter_call_locked(std::unique_lock<std::mutex>& lk) {
  cv_call_.wait(lk, [&] { return !in_call_; });  // another thread's forward: wait for its end
  in_call_ = true;
  owner_ = std::this_thread::get_id();
}

void ReadingRing::leave_call_locked() {
  in_call_ = false;
  cv_call_.notify_all();
}

void ReadingRing::io_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_io_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const int64_t item = queue_.front();
    queue_.pop_front();
    lk.unlock();
    std::string err;
    try {
      read_(item);
    } catch (const std::exception& e) {
      err = e.what();
    }
    lk.lock();
    --outstanding_;
    done_(item, err);
    cv_done_.notify_all();
  }
}

}  // namespace k3
