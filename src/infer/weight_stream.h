// Memory-limited inference: the routed experts are read from the checkpoint on demand into an
// expert cache the engine owns, so that a RAM budget is real anonymous memory, not page cache
// (docs/model.md section 9). The dense trunk is resident (owned copies) when it fits the
// budget, else its layers' matrices stream through a ring (infer/trunk_ring.h).
//
// ExpertStreamer is the MoE layers' ExpertProvider (kernels/moe.h):
//  - the cache is one arena of `slots` x slot_bytes (mmap'ed anonymous memory, 2 MiB aligned,
//    MADV_HUGEPAGE), each slot one whole expert (w1, w2, w3: packed nibbles and scales), the
//    kernels reading the bytes in place; ExpertCacheIndex (infer/expert_cache.h) decides
//    which experts stay (S3-FIFO by default, LRU for comparison);
//  - reads: pread with O_DIRECT where the file system allows it (every read widened to
//    4096-byte boundaries into 4096-aligned slot offsets; an expert's tensors that lie
//    together in the file are one read), else buffered pread followed by
//    posix_fadvise(DONTNEED) on the range; the mode is reported (io_mode());
//  - its reading ring (infer/reading_ring.h: the files, the arena, one I/O thread and the read
//    statistics) reads a call's missing experts sorted by file offset while the compute thread
//    runs the down projection, the shared experts and the experts already there; the experts
//    go out in groups (kernels/moe.h) as they arrive, pinned until the next group;
//  - a call reads each distinct expert once for all its rows (a prefill chunk, a batched
//    decode step), and a call needing more experts than the cache holds streams them through
//    it in groups; results are bitwise those of the resident run (the same kernels on the same
//    bytes, each expert writing its own rows).
// A read that fails or comes back short is a k3::Error naming the file, the offset, the
// tensor and the error (a truncated file: "short read"); its slot is dropped, never used. The
// forward it interrupts leaves that sequence's DecodeState part-way through the call: reset
// the sequence (or drop it) before using it again.
// Several threads may run forwards on one streamed model (sessions of a server): their MoE
// calls are served one at a time (a second thread's prefetch waits for the first call's
// finish).
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "infer/expert_cache.h"
#include "infer/head_stream.h"
#include "infer/reading_ring.h"
#include "infer/trunk_ring.h"
#include "kernels/moe.h"
#include "model/checkpoint.h"
#include "model/planner.h"

namespace k3 {

enum class IoMode { Auto, Direct, Buffered };
IoMode parse_io_mode(const std::string& s);  // "auto" | "direct" | "buffered"; k3::Error naming --io

struct StreamOptions {
  CachePolicy policy = CachePolicy::S3FIFO;
  IoMode io = IoMode::Auto;
  // Held back from the budget for activations, states and scratch: 0 (default) estimates it
  // for calls of up to tokens_per_call tokens (model/planner.h working_bytes_estimate; the
  // RssAnon check is the external one).
  uint64_t working_reserve_bytes = 0;
  int64_t tokens_per_call = 512;
  int64_t cache_slots = 0;  // > 0: exactly this many slots (tests); still checked against the budget
  // Test hook: replaces ::pread for expert reads (fault injection: errors, short reads).
  std::function<ssize_t(int fd, void* buf, size_t n, off_t off)> pread_hook;
  // The dense trunk through a ring (infer/trunk_ring.h) even when it would fit (tests and
  // measurements); it is streamed anyway when it does not fit the budget.
  bool stream_trunk = false;
  int64_t trunk_slots = 0;  // > 0: exactly this many ring slots; 0: two, or one if two do not fit
  int64_t trunk_pinned = -1;  // >= 0: exactly this many leading layers pinned with a ring; -1: as many as fit
  std::function<ssize_t(int fd, void* buf, size_t n, off_t off)> trunk_pread_hook;  // as pread_hook, trunk reads
  // The embedding and lm_head streamed (infer/head_stream.h) even when they would fit (tests
  // and measurements); they are streamed anyway when the budget needs it.
  bool stream_head = false;
  int64_t head_block_rows = 0;  // > 0: lm_head rows per block (the model's logits blocking too; tests)
  int64_t head_buffers = 2;
  std::function<ssize_t(int fd, void* buf, size_t n, off_t off)> head_pread_hook;  // as pread_hook, head reads
};

struct StreamStats {
  int64_t calls = 0;               // MoE calls served
  int64_t experts_requested = 0;   // distinct experts over all calls
  int64_t hits = 0, misses = 0, evictions = 0;
  int64_t reads = 0;               // pread calls
  uint64_t payload_bytes = 0;      // tensor bytes read (what the experts hold)
  uint64_t device_bytes = 0;       // bytes read from the files (payload + alignment widening + gaps)
  double io_seconds = 0;           // I/O thread inside pread
  double wait_seconds = 0;         // compute thread waiting for reads
  double hit_rate() const { return experts_requested ? double(hits) / double(experts_requested) : 0; }
};

class ExpertStreamer : public ExpertProvider {
 public:
  // Locations of every routed expert of `cfg` in `ck` (MXFP4), `slots` cache slots.
  ExpertStreamer(const CheckpointReader& ck, const K3Config& cfg, int64_t slots, const StreamOptions& opt);
  ~ExpertStreamer() override;
  ExpertStreamer(const ExpertStreamer&) = delete;
  ExpertStreamer& operator=(const ExpertStreamer&) = delete;

  void prefetch(int64_t layer, const int32_t* experts, int64_t n) override;
  ExpertGroup next() override;
  void finish() override;

  StreamStats stats() const;
  void reset_stats();
  int64_t slots() const { return slots_; }
  uint64_t slot_bytes() const { return ring_.slot_bytes(); }
  uint64_t arena_bytes() const { return ring_.arena_bytes(); }
  uint64_t expert_bytes() const { return expert_bytes_; }  // payload of one expert (the largest)
  const std::string& io_mode() const { return ring_.io_mode(); }

  // The slot size a checkpoint's experts need (payload + 4096-byte widening per read) and the
  // payload of one expert, without building a streamer (the budget check before loading).
  static void measure(const CheckpointReader& ck, const K3Config& cfg, uint64_t* slot_bytes, uint64_t* expert_bytes);

 private:
  struct Part {  // one stored tensor of an expert
    uint64_t offset = 0, nbytes = 0;
    uint64_t slot_off = 0;  // where its first byte lands in the slot
    int which = 0;          // 0..5: w1 packed, w1 scales, w3 packed, w3 scales, w2 packed, w2 scales
  };
  struct Run {  // one read: [start, start + len) of the file into slot offset slot_off
    uint64_t start = 0, len = 0, need = 0;  // need: bytes that must arrive (payload end - start)
    uint64_t slot_off = 0;
    int first_part = 0;
  };
  struct Loc {
    int file = 0;
    int64_t layer = 0, expert = 0;
    std::vector<Part> parts;  // file order
    std::vector<Run> runs;
  };
  struct SlotViews {
    Mxfp4Matrix m[3];      // w1, w3, w2
    ExpertMatrix em[3];
  };
  struct Job {
    int64_t key, slot;
    int32_t expert;
  };

  static std::vector<Loc> locate(const CheckpointReader& ck, const K3Config& cfg, std::vector<std::string>* files,
                                 uint64_t align, uint64_t* slot_bytes, uint64_t* expert_bytes);
  void read_job(int64_t slot);  // the I/O thread; throws k3::Error
  void job_read_locked(int64_t slot, const std::string& error);  // the I/O thread, after read_job
  void admit_locked();
  void abort_locked(std::unique_lock<std::mutex>& lk);
  void bind_views(int64_t slot, int64_t key);

  K3Config cfg_;
  StreamOptions opt_;
  std::vector<Loc> locs_;            // [moe_layers * E]
  std::vector<int64_t> moe_index_;   // layer -> MoE index (-1 dense)
  int64_t E_ = 0, slots_ = 0;
  uint64_t expert_bytes_ = 0, align_ = 4096;
  std::vector<SlotViews> views_;
  int group_target_ = 1;

  // Under ring_'s lock (the ring's outstanding count: admitted, not yet ready):
  ExpertCacheIndex index_;
  int64_t layer_ = -1;
  std::deque<Job> pending_;   // missing experts without a slot yet (file order)
  std::vector<Job> reading_;  // [slots] the expert a slot is being read for (queued or in progress)
  std::vector<Job> ready_;    // read or hit, pinned, not handed out
  std::vector<Job> handed_;   // the group in use (pinned)
  std::string error_;         // first read error of the call
  StreamStats st_;            // the ring's own counts (reads, bytes, times) are added by stats()
  std::vector<int32_t> g_experts_;
  std::vector<ExpertMatrix> g_w1_, g_w3_, g_w2_;
  ReadingRing ring_;          // last: stopped first
};

// A loaded model for inference, resident or under a RAM budget.
struct InferenceModel {
  K3Model model;
  std::shared_ptr<ExpertStreamer> stream;  // null: resident
  StreamProjection plan;                   // filled under a budget
  uint64_t trunk_bytes = 0;                // what the WeightStore holds (f32 buffer + bf16 copies)
  std::string trunk_note;                  // how the trunk is held under a budget
  std::shared_ptr<TrunkRing> trunk;        // the trunk's layers streamed (null: resident)
  std::shared_ptr<HeadStreamer> head;      // the embedding and lm_head streamed (null: held)
};

// The loading path of forward / generate / chat (and the server): opt.ram_budget_bytes == 0
// loads as load_model does (mapped, resident); otherwise the budget is checked and the trunk
// is read into owned memory: whole when it fits with the working reserve and two expert slots
// (and !so.stream_trunk), else its globals and vectors, its layers' matrices coming from a
// TrunkRing of two slots (one if two do not fit), the embedding and lm_head held or, when
// that does not fit, streamed by a HeadStreamer (the order: model/planner.h plan_streaming);
// a budget below even that is a k3::Error naming --ram-budget and the minimum. The experts come from an ExpertStreamer with as many
// slots as the rest of the budget holds (planner.h plan_streaming makes the choice).
// disk_bytes_per_s: for the plan line (0: measure with probe_read_bandwidth).
InferenceModel load_inference_model(const ModelDir& md, const LoadOptions& opt, const StreamOptions& so = {},
                                    double disk_bytes_per_s = 0);

// Sequential read bandwidth of the file (bytes per second): `bytes` read in 8 MiB O_DIRECT
// reads from the middle of the file (buffered with fadvise(DONTNEED) before, if O_DIRECT is
// refused); *how says which.
double probe_read_bandwidth(const std::string& path, uint64_t bytes, std::string* how);

// "stream: calls ..., hit rate ..., read ... GB (... from disk) ..., I/O ..." for reports.
std::string stream_stats_line(const ExpertStreamer& s);

}  // namespace k3
