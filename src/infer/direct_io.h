// What the expert streamer and the trunk ring share (infer/weight_stream.h, trunk_ring.h):
// opening a checkpoint's files for O_DIRECT reads with a buffered fallback, and the owned
// arenas their reads land in (anonymous mmap, 2 MiB aligned, MADV_HUGEPAGE, faulted in at
// once so the budget shows in RssAnon at load and the reads pay no page faults).
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace k3 {

// Offsets and sizes rounded to an alignment (O_DIRECT needs 4096-aligned offsets, lengths and
// buffers).
inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
inline uint64_t align_down(uint64_t x, uint64_t a) { return x / a * a; }

// Tensors of one read unit (an expert, a trunk layer) closer than this in the file are read as
// one run (the gap is read too): one larger pread beats several small ones.
constexpr uint64_t kMaxReadGap = uint64_t(64) << 10;

// Monotonic seconds, for the streamers' read and wait times.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// fds[i] for files[i]: O_DIRECT when `direct` (all files, else none), buffered otherwise.
// require_direct: a refused O_DIRECT is a k3::Error (--io direct). *direct_out: the mode
// used; *mode: how it is described ("O_DIRECT pread ..." / "buffered pread ... (why)").
void open_for_reads(const std::vector<std::string>& files, bool direct, bool require_direct, bool buffered_asked,
                    std::vector<int>* fds, bool* direct_out, std::string* mode);

// `bytes` (rounded up to 2 MiB) of zeroed anonymous memory, 2 MiB aligned; `what` names it
// in the error if the mapping fails. Give it back with unmap_owned_arena(p, *rounded).
uint8_t* map_owned_arena(uint64_t bytes, const std::string& what, uint64_t* rounded);
void unmap_owned_arena(uint8_t* p, uint64_t rounded);

using PreadHook = std::function<ssize_t(int fd, void* buf, size_t n, off_t off)>;  // tests: fault injection

// One widened read: [start, start + len) of fd into dst, of which the first `need` bytes must
// arrive (the rest is alignment widening past the end of the file). EINTR is retried; an
// error or a short read is a k3::Error "reading <what(got)>: ..." (what: the payload, the
// file and the offset reached). account(seconds, n) after every pread (the caller's stats).
// Buffered reads drop the range from the page cache afterwards (posix_fadvise DONTNEED).
void read_run(int fd, uint8_t* dst, uint64_t start, uint64_t len, uint64_t need, bool direct, const PreadHook& hook,
              const std::function<void(double seconds, ssize_t n)>& account,
              const std::function<std::string(uint64_t got)>& what);

}  // namespace k3
