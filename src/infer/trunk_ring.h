// The dense trunk streamed layer by layer through a ring (memory-limited inference when the
// trunk does not fit the budget; docs/model.md section 9, where the public C engine does the
// same with a pinned prefix). The model's TrunkProvider (model/trunk_provider.h):
//  - N slots (2 by default: one layer computes while the next is read) in one owned arena
//    (anonymous mmap, 2 MiB aligned, MADV_HUGEPAGE, faulted in at construction), each sized
//    for the largest layer: its dense matrices as read (bf16 as stored, used in place) plus
//    an f32 area for the matrices the resident model would hold in f32 (f32 or f16 stored, or
//    bf16 without dense_as_stored), converted on the I/O thread exactly as the loader does;
//    a layer's vectors, norms and conv taps stay in the model's store (< 1 % of its bytes);
//  - reads: a layer's matrices sorted by file offset, tensors closer than 64 KiB in one run,
//    pread with O_DIRECT (runs widened to 4096-byte boundaries into 4096-aligned slot
//    offsets) where the file system allows it, else buffered pread + fadvise(DONTNEED);
//  - its own reading ring (infer/reading_ring.h: files, arena, I/O thread, statistics), not
//    the expert streamer's: the trunk read of layer i + 1 and the expert reads of layer i then
//    queue on the disk together, and neither protocol waits on the other's bookkeeping;
//  - a slot keeps its layer after release, so a model with L <= N layers reads its trunk
//    once; otherwise every forward call reads every streamed layer once (the planner's trunk
//    bytes);
//  - a prefix of layers may be pinned (held by the model's store, never read: the budget
//    has room for some layers but not all; the public C engine does the same).
// A read that fails or comes back short is a k3::Error from acquire naming the file, the
// offset, the tensor and the cause; the slot is emptied and the next acquire reads again. A
// read ahead (prefetch) that failed is read once more by the acquire that needs it, and only
// that read's failure is reported (a fault seen ahead of time may be gone by then).
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "infer/reading_ring.h"
#include "io/safetensors.h"
#include "model/planner.h"
#include "model/trunk_provider.h"
#include "model/weights.h"

namespace k3 {

struct TrunkRingOptions {
  int64_t slots = 2;
  int64_t pinned = 0;            // layers [0, pinned) held by the store (LoadOptions::pinned_layers), never read
  bool direct = true;            // try O_DIRECT (false: buffered + fadvise)
  bool require_direct = false;   // --io direct: refusing O_DIRECT is an error
  bool dense_as_stored = true;   // bf16 matrices used as stored (the loader's LoadOptions::dense_as_stored)
  // Test hook: replaces ::pread for trunk reads (fault injection).
  std::function<ssize_t(int fd, void* buf, size_t n, off_t off)> pread_hook;
};

struct TrunkStats {
  int64_t acquires = 0;        // layers handed to the forward
  int64_t hits = 0;            // acquired with the bytes already there (read ahead, or kept)
  int64_t layer_reads = 0;     // layers read
  int64_t reads = 0;           // pread calls
  uint64_t payload_bytes = 0;  // matrix bytes read (what the layers hold)
  uint64_t device_bytes = 0;   // bytes read from the files (payload + alignment widening + gaps)
  double io_seconds = 0;       // I/O thread inside pread
  double wait_seconds = 0;     // compute thread waiting in acquire
};

class TrunkRing : public TrunkProvider {
 public:
  // The layers' streamed matrices (store.layout().streamed) located in `ck`; the rest of each
  // layer's views point into `store`'s buffer (the model's: it must outlive the ring; moving
  // the store keeps its buffer).
  TrunkRing(const CheckpointReader& ck, const WeightStore& store, const TrunkRingOptions& opt);
  ~TrunkRing() override;
  TrunkRing(const TrunkRing&) = delete;
  TrunkRing& operator=(const TrunkRing&) = delete;

  void begin_call() override;
  void end_call() override;
  LayerWeights& acquire(int64_t layer) override;
  void prefetch(int64_t layer) override;
  void release(int64_t layer) override;
  int64_t first_streamed() const override { return opt_.pinned; }

  TrunkStats stats() const;
  void reset_stats();
  int64_t slots() const { return int64_t(slots_.size()); }
  uint64_t slot_bytes() const { return ring_.slot_bytes(); }
  uint64_t arena_bytes() const { return ring_.arena_bytes(); }
  uint64_t layer_payload_bytes(int64_t layer) const { return layers_.at(size_t(layer)).payload; }
  uint64_t layer_device_bytes(int64_t layer) const { return layers_.at(size_t(layer)).device; }
  const std::string& io_mode() const { return ring_.io_mode(); }
  // Waits until no read is queued or in progress (tests, before reading the statistics).
  void wait_idle();

  // The ring's sizes for a checkpoint without building one (the budget check before
  // loading): slot bytes (the largest layer, with `align` widening), the bytes one pass over
  // every layer reads, and the trunk bytes that stay held (globals + every layer's vectors).
  static TrunkRingPlan measure(const CheckpointReader& ck, const K3Config& cfg, bool dense_as_stored, int64_t slots);

 private:
  struct Part {  // one streamed matrix of a layer
    std::string name;
    int file = 0;
    uint64_t offset = 0, nbytes = 0;
    DType dtype = DType::F32;
    bool in_place = false;  // bf16 used as read; else converted to f32 at f32_off
    uint64_t raw_off = 0;   // slot offset of its first stored byte
    uint64_t f32_off = 0;   // slot offset of its f32 copy (!in_place)
    int64_t numel = 0;
  };
  struct Run {  // one read: [start, start + len) of a file into slot offset slot_off
    int file = 0;
    uint64_t start = 0, len = 0, need = 0;
    uint64_t slot_off = 0;
    size_t first_part = 0;
  };
  struct Layer {
    std::vector<Part> parts;  // file order
    std::vector<Run> runs;
    uint64_t bytes = 0;            // slot bytes used (raw runs + f32 area)
    uint64_t payload = 0, device = 0;
    std::unordered_map<std::string, size_t> by_name;  // streamed matrix -> part
    std::unordered_map<std::string, Mat> held;        // the layer's other tensors, in the store
  };
  struct Slot {
    int64_t layer = -1;
    enum State { Empty, Reading, Ready } state = Empty;
    int pins = 0;
    uint64_t last_use = 0;
    int64_t bound = -1;  // the layer views_ were built for
    bool ahead = false;  // the read was started by a prefetch (a failure is read again once)
    std::string error;
  };

  static std::vector<Layer> locate(const CheckpointReader& ck, const K3Config& cfg, bool dense_as_stored,
                                   std::vector<std::string>* files);
  void read_layer(int64_t slot);  // the I/O thread; throws k3::Error
  void layer_read_locked(int64_t slot, const std::string& error);  // the I/O thread, after read_layer
  int64_t find_locked(int64_t layer) const;
  bool start_read_locked(int64_t layer, bool ahead);  // false: no free slot
  void bind(int64_t slot);

  K3Config cfg_;
  TrunkRingOptions opt_;
  std::vector<Layer> layers_;
  std::vector<LayerWeights> views_;  // per slot

  // Under ring_'s lock:
  std::vector<Slot> slots_;
  int64_t wanted_ = -1;  // a prefetch that found no free slot
  uint64_t tick_ = 0;
  TrunkStats st_;        // the ring's own counts (reads, bytes, times) are added by stats()
  ReadingRing ring_;     // last: stopped first
};

// "trunk ring: N slots ..., read ... GB in ... layer reads ..., waited ... s" for reports.
std::string trunk_stats_line(const TrunkRing& r);

}  // namespace k3
