// What the expert streamer and the trunk ring share (infer/weight_stream.h, trunk_ring.h):
// opening a checkpoint's files for O_DIRECT reads with a buffered fallback, and the owned
// arenas their reads land in (anonymous mmap, 2 MiB aligned, MADV_HUGEPAGE, faulted in at
// once so the budget shows in RssAnon at load and the reads pay no page faults).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

// fds[i] for files[i]: O_DIRECT when `direct` (all files, else none), buffered otherwise.
// require_direct: a refused O_DIRECT is a k3::Error (--io direct). *direct_out: the mode
// used; *mode: how it is described ("O_DIRECT pread ..." / "buffered pread ... (why)").
void open_for_reads(const std::vector<std::string>& files, bool direct, bool require_direct, bool buffered_asked,
                    std::vector<int>* fds, bool* direct_out, std::string* mode);

// `bytes` (rounded up to 2 MiB) of zeroed anonymous memory, 2 MiB aligned; `what` names it
// in the error if the mapping fails. Give it back with unmap_owned_arena(p, *rounded).
uint8_t* map_owned_arena(uint64_t bytes, const std::string& what, uint64_t* rounded);
void unmap_owned_arena(uint8_t* p, uint64_t rounded);

}  // namespace k3
