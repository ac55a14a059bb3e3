// O_DIRECT file opening and owned arenas (see direct_io.h).
#include "infer/direct_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace k3 {

namespace {
constexpr uint64_t kHuge = uint64_t(2) << 20;
}  // namespace

void open_for_reads(const std::vector<std::string>& files, bool direct, bool require_direct, bool buffered_asked,
                    std::vector<int>* fds, bool* direct_out, std::string* mode) {
  std::string why_not;
  fds->clear();
  for (const std::string& f : files) {
    if (!direct) break;
    const int fd = ::open(f.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      if (require_direct) fail_system("cannot open with O_DIRECT (--io direct)", f);
      why_not = std::string("open(O_DIRECT) failed: ") + std::strerror(e);
      direct = false;
      for (int o : *fds) ::close(o);
      fds->clear();
      break;
    }
    fds->push_back(fd);
  }
  if (!direct)
    for (const std::string& f : files) {
      const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail_system("cannot open", f);
      fds->push_back(fd);
    }
  *direct_out = direct;
  *mode = direct ? "O_DIRECT pread (4096-byte aligned)"
                 : "buffered pread + posix_fadvise(DONTNEED)" +
                       (buffered_asked ? std::string(" (--io buffered)") : " (" + why_not + ")");
}

uint8_t* map_owned_arena(uint64_t bytes, const std::string& what, uint64_t* rounded) {
  const uint64_t n = align_up(std::max<uint64_t>(bytes, 1), kHuge);
  void* p = ::mmap(nullptr, n + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (%.3f GB)", double(n) / 1e9);
    fail_system("cannot reserve " + what + buf, "mmap");
  }
  // 2 MiB-aligned start; the unaligned head and the tail are given back.
  uint8_t* base = static_cast<uint8_t*>(p);
  uint8_t* al = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(base), kHuge));
  if (al > base) ::munmap(base, size_t(al - base));
  const size_t tail = size_t((base + n + kHuge) - (al + n));
  if (tail) ::munmap(al + n, tail);
#ifdef MADV_HUGEPAGE
  ::madvise(al, n, MADV_HUGEPAGE);
#endif
  std::memset(al, 0, n);  // fault it in now: the budget is taken at load
  *rounded = n;
  return al;
}

void unmap_owned_arena(uint8_t* p, uint64_t rounded) {
  if (p) ::munmap(p, rounded);
}

void read_run(int fd, uint8_t* dst, uint64_t start, uint64_t len, uint64_t need, bool direct, const PreadHook& hook,
              const std::function<void(double seconds, ssize_t n)>& account,
              const std::function<std::string(uint64_t got)>& what) {
  using Clock = std::chrono::steady_clock;
  uint64_t got = 0;
  while (got < len) {
    const auto t0 = Clock::now();
    const off_t at = off_t(start + got);
    const ssize_t n = hook ? hook(fd, dst + got, size_t(len - got), at) : ::pread(fd, dst + got, size_t(len - got), at);
    const int err = errno;
    account(std::chrono::duration<double>(Clock::now() - t0).count(), n);
    if (n < 0) {
      if (err == EINTR) continue;
      fail("reading " + what(got) + ": " + std::strerror(err));
    }
    if (n == 0) {
      if (got >= need) break;  // end of file inside the alignment widening
      fail("reading " + what(got) + ": short read, got " + std::to_string(got) + " of " + std::to_string(need) +
           " bytes (the file ends there: truncated or replaced while in use?)");
    }
    got += uint64_t(n);
  }
  if (!direct) ::posix_fadvise(fd, off_t(start), off_t(len), POSIX_FADV_DONTNEED);
}

}  // namespace k3
