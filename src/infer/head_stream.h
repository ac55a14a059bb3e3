// The embedding and the lm_head streamed from the checkpoint (memory-limited inference when
// they do not fit the budget beside the trunk: 4.70 GB of the full K3's bf16 weights;
// docs/model.md section 9). The model's HeadProvider
// (model/head_provider.h):
//  - embedding rows on demand: one pread per token (the row's 4096-byte aligned window with
//    O_DIRECT, into a small owned buffer), widened to f32 exactly as the loader and mat_row do;
//  - the lm_head in blocks of K3Model::head_block_rows() rows (about 32 MB in bf16), each one
//    contiguous range of the file read into one of `buffers` owned buffers (2: the next block
//    read by the I/O thread while the current one computes; blocks 0 and 1 of the next call
//    read ahead when a call ends), bf16 used in place or widened to f32 as the loader would
//    hold it; a lm_head of no more blocks than buffers is read once;
//  - files, buffers, I/O thread and read statistics are its own reading ring's
//    (infer/reading_ring.h): pread with O_DIRECT where the file system allows it (widened to
//    4096-byte boundaries), else buffered pread + fadvise(DONTNEED).
// A read that fails or comes back short is a k3::Error naming the file, the offset and the
// tensor (the rows of the block, or the token's row); the buffer is emptied and the next call
// reads again; a read ahead that failed is read once more by the acquire that needs it.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "infer/direct_io.h"
#include "infer/reading_ring.h"
#include "io/safetensors.h"
#include "model/head_provider.h"
#include "model/planner.h"

namespace k3 {

struct HeadStreamOptions {
  int64_t block_rows = 0;        // lm_head rows per block: the model's head_block_rows() (0: lm_head_block_rows)
  int64_t buffers = 2;           // lm_head block buffers (>= 1; 1: no read while a block computes)
  bool direct = true;            // try O_DIRECT (false: buffered + fadvise)
  bool require_direct = false;   // --io direct: refusing O_DIRECT is an error
  bool dense_as_stored = true;   // a bf16 lm_head used as stored (else widened to f32, as the loader holds it)
  PreadHook pread_hook;          // tests: replaces ::pread (fault injection)
};

struct HeadStats {
  int64_t embed_rows = 0;          // embedding rows read (one per token)
  uint64_t embed_device_bytes = 0;  // bytes read for them (the aligned windows)
  int64_t block_acquires = 0;      // lm_head blocks handed to the product
  int64_t block_hits = 0;          // acquired with the bytes already there (read ahead, or kept)
  int64_t block_reads = 0;         // lm_head blocks read
  int64_t reads = 0;               // pread calls (blocks and rows)
  uint64_t payload_bytes = 0;      // lm_head bytes read (the rows' stored bytes)
  uint64_t device_bytes = 0;       // lm_head bytes read from the file (payload + alignment widening)
  double io_seconds = 0;           // inside pread (blocks on the I/O thread, rows on the caller)
  double wait_seconds = 0;         // compute thread waiting for a block
};

class HeadStreamer : public HeadProvider {
 public:
  HeadStreamer(const CheckpointReader& ck, const K3Config& cfg, const HeadStreamOptions& opt);
  ~HeadStreamer() override;
  HeadStreamer(const HeadStreamer&) = delete;
  HeadStreamer& operator=(const HeadStreamer&) = delete;

  void embed_rows(float* dst, const int32_t* ids, int64_t T) override;
  int64_t block_rows() const override { return block_rows_; }
  void begin_head() override;
  void end_head() override;
  Mat acquire_block(int64_t b) override;
  void release_block(int64_t b) override;

  HeadStats stats() const;
  void reset_stats();
  void wait_idle();  // no block read queued or in progress (tests, before reading statistics)
  int64_t blocks() const { return int64_t(blocks_.size()); }
  int64_t buffers() const { return int64_t(bufs_.size()); }
  uint64_t buffer_bytes() const { return ring_.slot_bytes(); }
  uint64_t arena_bytes() const { return ring_.arena_bytes(); }
  uint64_t block_device_bytes(int64_t b) const { return blocks_.at(size_t(b)).len; }
  const std::string& io_mode() const { return ring_.io_mode(); }

  // The sizes for a checkpoint without building a streamer (the budget check before loading).
  static HeadStreamPlan measure(const CheckpointReader& ck, const K3Config& cfg, const HeadStreamOptions& opt);

 private:
  struct Block {  // rows [row0, row0 + rows): file range [start, start + len), of which need must arrive
    int64_t row0 = 0, rows = 0;
    uint64_t start = 0, len = 0, need = 0, skip = 0;  // skip: the first row's byte in the buffer
  };
  struct Buf {
    int64_t block = -1;
    enum State { Empty, Reading, Ready } state = Empty;
    int pins = 0;
    uint64_t last_use = 0;
    bool ahead = false;
    std::string error;
  };
  struct Tensors {  // where the two matrices lie
    TensorInfo embed, head;
  };
  static Tensors find_tensors(const CheckpointReader& ck, const K3Config& cfg);
  static std::vector<Block> plan_blocks(const TensorInfo& head, int64_t d, int64_t block_rows, uint64_t* buf_bytes,
                                        bool in_place);
  void read_block(int64_t buf);  // the I/O thread; throws k3::Error
  void block_read_locked(int64_t buf, const std::string& error);  // the I/O thread, after read_block
  int64_t find_locked(int64_t block) const;
  bool start_read_locked(int64_t block, bool ahead, int64_t from, int64_t n);
  void read_ahead_locked(int64_t from, int64_t n);  // blocks from, ..., from + n - 1 (cyclic) into free buffers

  K3Config cfg_;
  HeadStreamOptions opt_;
  Tensors t_;
  int64_t d_ = 0, V_ = 0, block_rows_ = 0;
  bool in_place_ = false;  // lm_head bf16 used as read
  std::vector<Block> blocks_;
  std::mutex embed_mu_;  // one embed_rows call at a time (it reads into the ring's tail)

  // Under ring_'s lock:
  std::vector<Buf> bufs_;
  uint64_t tick_ = 0;
  HeadStats st_;     // the ring's own counts (reads, bytes, times) are added by stats()
  ReadingRing ring_;  // files [0] the embedding's, [1] the lm_head's; buffers, then the embedding row; last: stopped first
};

// "head stream: ... embedding rows ..., lm_head N blocks ..., read ... GB ..." for reports.
std::string head_stats_line(const HeadStreamer& h);

}  // namespace k3
