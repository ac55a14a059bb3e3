// A whole file mapped read-only (POSIX mmap, MAP_PRIVATE, PROT_READ). The mapping lives as
// long as the last shared_ptr to it, so tensor views into it keep it alive. Writing through
// a pointer into the mapping faults: views of checkpoint files are read-only by contract.
// If another process truncates the file while it is mapped, touching the lost pages raises
// SIGBUS; k3cpp's writers never modify a file in place (io/atomic_file.h renames a new one).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace k3 {

class MappedFile {
 public:
  // k3::Error naming the path if it cannot be opened, is not a regular file, or mmap fails.
  // An empty file gives a valid object with size() == 0 and data() == nullptr.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

}  // namespace k3
