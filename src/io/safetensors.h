// Safetensors reading and writing (https://github.com/huggingface/safetensors, format:
// 8-byte little-endian header length N, N bytes of JSON header {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data section; offsets
// are relative to the data section).
//
// Reader contract: a file is fully validated before any tensor is exposed (header length,
// JSON well-formedness, duplicate keys, entry fields and types, dtype, shape, offsets within
// the data section, nbytes == numel * dtype size without overflow, no overlapping ranges);
// every refusal is a k3::Error naming the file and the tensor or field. Tensors are
// zero-copy views of the read-only mapping when their data is aligned to the dtype size
// (always so for files written here and by the reference implementation); a misaligned
// tensor (possible in files from other writers) is returned as an owned aligned copy, so
// that kernels may always dereference typed pointers. Views are read-only: writing through
// them faults. Copy (Tensor::clone) before modifying.
//
// Writer contract: header keys in insertion order (__metadata__ first), padded with spaces
// so that the data section starts at a multiple of 8; data tightly packed (no holes, as the
// reference loader requires) and laid out in insertion order stably sorted by dtype size,
// largest first, so that every tensor is naturally aligned in the file (the reference writer
// also orders by alignment). Files are replaced atomically (io/atomic_file.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/mmap_file.h"

namespace k3 {

// Largest header accepted (and written): the reference implementation's limit.
constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::string file;     // path of the .safetensors file holding it
  uint64_t offset = 0;  // absolute byte offset of the data within `file`
  uint64_t nbytes = 0;
};

// How a header (or index) is read. Walk: one pass of nlohmann's SAX parser that checks keys
// and captures the entries, building no JSON tree; anything unusual (a wrong type, an extra
// field in an entry, a failed check) makes it fall back to Tree, which reports the error
// with its message. Tree: always build the tree (the plain path, which tests compare against).
// The walk exists for memory: a tree costs about 1.3 KB per tensor while loading
// (docs/memory-limited.md, "Working memory").
enum class HeaderParse { Walk, Tree };

// One .safetensors file, mmap'ed read-only. Validates everything before exposing any view.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path, HeaderParse parse = HeaderParse::Walk);
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file offset order
  const TensorInfo* find(const std::string& name) const;               // nullptr if absent
  Tensor get(const std::string& name) const;  // zero-copy view (see above); k3::Error if absent
  Tensor get(const TensorInfo& info) const;   // info must come from this file's tensors()
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // __metadata__
  const std::string& path() const { return map_->path(); }
  // The whole mapped file (tests check that every view lies inside it).
  const uint8_t* mapped_data() const { return map_->data(); }
  uint64_t mapped_size() const { return map_->size(); }
  uint64_t header_size() const { return header_size_; }  // N, excluding the 8-byte prefix

 private:
  std::shared_ptr<MappedFile> map_;
  uint64_t header_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<uint32_t> by_name_;  // positions in tensors_, sorted by name
  std::map<std::string, std::string> metadata_;
};

// A checkpoint: a single .safetensors file, or a directory of shards with or without
// model.safetensors.index.json (without it: every *.safetensors file in the directory).
// A path to an index .json file is also accepted. With an index, the exposed tensors are
// exactly its weight_map, and every entry must exist in the file it names. Duplicate names
// across the opened shards are refused.
class CheckpointReader {
 public:
  static CheckpointReader open(const std::string& path, HeaderParse parse = HeaderParse::Walk);
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return find(name) != nullptr; }
  const TensorInfo& info(const std::string& name) const;  // k3::Error naming the tensor if absent
  Tensor get(const std::string& name) const;  // zero-copy view (mmap), keeps the file alive
  size_t size() const { return entries_.size(); }
  const std::string& path() const { return path_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  const Entry* find(const std::string& name) const;  // nullptr if absent
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::vector<Entry> entries_;  // sorted by name (the names are the files' TensorInfo names)
};

// Writer: collects tensors (keeping them alive, copying nothing) and writes one file.
class SafetensorsWriter {
 public:
  // k3::Error on a duplicate name, the reserved name "__metadata__", a name that is not
  // valid UTF-8, or an undefined/non-contiguous tensor.
  void add(const std::string& name, const Tensor& t);
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;  // tmp file + fsync + rename (atomic)
  uint64_t data_bytes() const { return data_bytes_; }
  size_t size() const { return tensors_.size(); }
  // The exact bytes that precede the data (8-byte length + padded header), and the data
  // order, as write() lays them out; exposed for tests and tools.
  std::string header_bytes() const;
  std::vector<size_t> data_order() const;  // indices into insertion order

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
  std::map<std::string, size_t> names_;
  std::vector<std::pair<std::string, std::string>> metadata_;  // insertion order, unique keys
  uint64_t data_bytes_ = 0;
};

// Shards tensors (in insertion order) into files of at most max_shard_bytes of data each
// (a larger single tensor gets its own shard): model-00001-of-0000N.safetensors ... plus
// model.safetensors.index.json {"metadata": {"total_size": N}, "weight_map": {name: file}}.
// A single shard is written as model.safetensors with no index. `metadata` goes into every
// shard's __metadata__. Creates `dir` if needed. After the new files are in place, removes
// files of an earlier checkpoint in `dir` that readers would otherwise mix in (a stale
// index when writing one shard, model-XXXXX-of-YYYYY.safetensors shards not written now,
// model.safetensors when writing several shards). Each file is replaced atomically; the
// directory as a whole is not (a crash midway can leave old and new shards side by side).
// Returns the paths written (shards in order, then the index if any).
std::vector<std::string> write_checkpoint_shards(const std::string& dir,
                                                 const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                 uint64_t max_shard_bytes,
                                                 const std::map<std::string, std::string>& metadata = {});

}  // namespace k3
