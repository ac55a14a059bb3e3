// The embedding and the lm_head streamed from the checkpoint (see head_stream.h).
#include "infer/head_stream.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "infer/direct_io.h"
#include "model/k3_model.h"
#include "model/param_specs.h"

namespace k3 {

namespace {

constexpr uint64_t kAlign = 4096;  // O_DIRECT granularity; also used buffered (same buffer layout)


uint64_t elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

// Stored rows as the resident model holds them (f32), exactly as the loader converts.
void widen_rows(float* dst, const uint8_t* src, DType t, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); break;
    case DType::BF16: bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, n); break;
    case DType::F16: f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, n); break;
    default: K3_ASSERT(false, "head stream: not a float dtype");
  }
}

}  // namespace

HeadStreamer::Tensors HeadStreamer::find_tensors(const CheckpointReader& ck, const K3Config& cfg) {
  Tensors t;
  const std::string embed = kModelPrefix + "embed_tokens.weight";
  const std::string head = cfg.tie_word_embeddings ? embed : kLmHeadName;
  const Shape want = {cfg.vocab_size, cfg.hidden_size};
  for (const std::string& n : {embed, head}) {
    const TensorInfo& ti = ck.info(n);
    if (ti.shape != want) fail_input(ti.file, n, "shape " + shape_str(ti.shape) + ", expected " + shape_str(want));
    if (ti.dtype != DType::F32 && ti.dtype != DType::BF16 && ti.dtype != DType::F16)
      fail_input(ti.file, n, std::string("dtype ") + dtype_name(ti.dtype) + ", expected f32, bf16 or f16");
  }
  t.embed = ck.info(embed);
  t.head = ck.info(head);
  return t;
}

std::vector<HeadStreamer::Block> HeadStreamer::plan_blocks(const TensorInfo& head, int64_t d, int64_t block_rows,
                                                           uint64_t* buf_bytes, bool in_place) {
  const int64_t V = head.shape[0];
  const uint64_t rb = uint64_t(d) * elem_bytes(head.dtype);
  std::vector<Block> blocks;
  uint64_t most = 0;
  for (int64_t r0 = 0; r0 < V; r0 += block_rows) {
    Block b;
    b.row0 = r0;
    b.rows = std::min(block_rows, V - r0);
    const uint64_t s = head.offset + uint64_t(r0) * rb, e = s + uint64_t(b.rows) * rb;
    b.start = align_down(s, kAlign);
    b.len = align_up(e, kAlign) - b.start;
    b.need = e - b.start;
    b.skip = s - b.start;
    // The f32 copy (when not used in place) after the raw bytes, 64-byte aligned.
    const uint64_t bytes = in_place ? b.len : align_up(b.len, 64) + uint64_t(b.rows) * uint64_t(d) * 4;
    most = std::max(most, bytes);
    blocks.push_back(b);
  }
  *buf_bytes = align_up(std::max<uint64_t>(most, 1), kAlign);
  return blocks;
}

HeadStreamPlan HeadStreamer::measure(const CheckpointReader& ck, const K3Config& cfg, const HeadStreamOptions& opt) {
  const Tensors t = find_tensors(ck, cfg);
  const int64_t br = opt.block_rows > 0 ? opt.block_rows : lm_head_block_rows(cfg);
  const bool in_place = opt.dense_as_stored && t.head.dtype == DType::BF16;
  HeadStreamPlan p;
  p.streamed = true;
  uint64_t buf = 0;
  const std::vector<Block> blocks = plan_blocks(t.head, cfg.hidden_size, br, &buf, in_place);
  p.blocks = int64_t(blocks.size());
  p.buffers = std::max<int64_t>(1, std::min<int64_t>(opt.buffers, p.blocks));
  p.block_rows = br;
  for (const Block& b : blocks) p.pass_bytes += b.len;
  const uint64_t erb = uint64_t(cfg.hidden_size) * elem_bytes(t.embed.dtype);
  p.embed_row_bytes = align_up(erb, kAlign) + kAlign;
  p.buffer_bytes = uint64_t(p.buffers) * buf + p.embed_row_bytes;
  // What the resident engine holds for them: bf16 as stored with dense_as_stored, else f32.
  const uint64_t n = uint64_t(cfg.vocab_size) * uint64_t(cfg.hidden_size);
  auto held = [&](const TensorInfo& ti) { return n * (opt.dense_as_stored && ti.dtype == DType::BF16 ? 2 : 4); };
  p.held_bytes = held(t.embed) + (cfg.tie_word_embeddings ? 0 : held(t.head));
  return p;
}

HeadStreamer::HeadStreamer(const CheckpointReader& ck, const K3Config& cfg, const HeadStreamOptions& opt)
    : cfg_(cfg), opt_(opt), t_(find_tensors(ck, cfg)), d_(cfg.hidden_size), V_(cfg.vocab_size) {
  K3_ASSERT(opt.buffers >= 1, "head stream: needs at least one lm_head buffer");
  block_rows_ = std::min<int64_t>(opt.block_rows > 0 ? opt.block_rows : lm_head_block_rows(cfg), V_);
  in_place_ = opt.dense_as_stored && t_.head.dtype == DType::BF16;
  uint64_t buf_bytes = 0;
  blocks_ = plan_blocks(t_.head, d_, block_rows_, &buf_bytes, in_place_);
  const int64_t nbuf = std::min<int64_t>(opt.buffers, int64_t(blocks_.size()));  // more than blocks: never used
  ring_.open_files({t_.embed.file, t_.head.file}, opt.direct, opt.require_direct, !opt.direct);
  const uint64_t embed_buf_bytes = align_up(uint64_t(d_) * elem_bytes(t_.embed.dtype), kAlign) + kAlign;
  ring_.map_arena(nbuf, buf_bytes, embed_buf_bytes, "the lm_head block buffers");
  bufs_.resize(size_t(nbuf));
  ring_.start([this](int64_t buf) { read_block(buf); },
              [this](int64_t buf, const std::string& error) { block_read_locked(buf, error); });
  auto lk = ring_.lock();
  read_ahead_locked(0, nbuf);  // the first call's first blocks, read while the rest loads
}

HeadStreamer::~HeadStreamer() = default;

void HeadStreamer::embed_rows(float* dst, const int32_t* ids, int64_t T) {
  std::lock_guard<std::mutex> call(embed_mu_);
  uint8_t* buf = ring_.tail();
  const uint64_t rb = uint64_t(d_) * elem_bytes(t_.embed.dtype);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = ids[t];
    K3_ASSERT(id >= 0 && id < V_, "head stream: token id outside the vocabulary");
    const uint64_t s = t_.embed.offset + uint64_t(id) * rb, start = align_down(s, kAlign);
    const uint64_t len = align_up(s + rb, kAlign) - start;
    auto what = [&](uint64_t got) {
      return "the embedding row of token " + std::to_string(id) + " (" + t_.embed.name + ", " + std::to_string(rb) +
             " bytes at offset " + std::to_string(s) + ") from " + t_.embed.file + " at offset " +
             std::to_string(start + got);
    };
    ring_.read(0, buf, start, len, s + rb - start, opt_.pread_hook, what, &st_.embed_device_bytes);
    widen_rows(dst + t * d_, buf + (s - start), t_.embed.dtype, size_t(d_));
    const auto lk = ring_.lock();
    ++st_.embed_rows;
  }
}

// The buffer's block is set before the read is queued and stays while it is Reading, so the
// I/O thread reads it without the lock.
void HeadStreamer::read_block(int64_t buf) {
  const Block& b = blocks_[size_t(bufs_[size_t(buf)].block)];
  uint8_t* base = ring_.slot(buf);
  auto what = [&](uint64_t got) {
    return "the lm_head rows " + std::to_string(b.row0) + " to " + std::to_string(b.row0 + b.rows - 1) + " (" +
           t_.head.name + ", a read of " + std::to_string(b.need) + " bytes from offset " + std::to_string(b.start) +
           ") from " + t_.head.file + " at offset " + std::to_string(b.start + got);
  };
  ring_.read(1, base, b.start, b.len, b.need, opt_.pread_hook, what);
  if (!in_place_)
    widen_rows(reinterpret_cast<float*>(base + align_up(b.len, 64)), base + b.skip, t_.head.dtype,
               size_t(b.rows) * size_t(d_));
}

void HeadStreamer::block_read_locked(int64_t buf, const std::string& error) {
  Buf& s = bufs_[size_t(buf)];
  ++st_.block_reads;
  s.state = Buf::Ready;  // with an error: acquire reports it and empties the buffer
  s.error = error;
  if (error.empty()) st_.payload_bytes += blocks_[size_t(s.block)].need - blocks_[size_t(s.block)].skip;
}

int64_t HeadStreamer::find_locked(int64_t block) const {
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (bufs_[i].block == block && bufs_[i].state != Buf::Empty) return int64_t(i);
  return -1;
}

bool HeadStreamer::start_read_locked(int64_t block, bool ahead, int64_t from, int64_t n) {
  // A free buffer: not pinned, not being read, not holding a block of the window [from, from + n)
  // (cyclic) that is wanted next; an empty one first, else the least recently used.
  const int64_t nb = int64_t(blocks_.size());
  auto wanted = [&](int64_t b) { return b >= 0 && ((b - from) % nb + nb) % nb < n; };
  int64_t best = -1;
  for (size_t i = 0; i < bufs_.size(); ++i) {
    const Buf& s = bufs_[i];
    if (s.pins > 0 || s.state == Buf::Reading || (s.state == Buf::Ready && wanted(s.block))) continue;
    if (best < 0 || (s.state == Buf::Empty && bufs_[size_t(best)].state != Buf::Empty) ||
        (s.state == bufs_[size_t(best)].state && s.last_use < bufs_[size_t(best)].last_use))
      best = int64_t(i);
  }
  if (best < 0) return false;
  Buf& s = bufs_[size_t(best)];
  s.block = block;
  s.state = Buf::Reading;
  s.error.clear();
  s.ahead = ahead;
  s.last_use = ++tick_;
  ring_.queue_locked(best);
  return true;
}

void HeadStreamer::read_ahead_locked(int64_t from, int64_t n) {
  const int64_t nb = int64_t(blocks_.size());
  n = std::min(n, nb);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t b = (from + k) % nb;
    if (find_locked(b) >= 0) continue;
    if (!start_read_locked(b, true, from, n)) return;
  }
}

void HeadStreamer::begin_head() {
  auto lk = ring_.lock();
  ring_.enter_call_locked(lk);
}

void HeadStreamer::end_head() {
  auto lk = ring_.lock();
  for (Buf& s : bufs_) s.pins = 0;  // a product that threw may still hold its block
  read_ahead_locked(0, int64_t(bufs_.size()));  // the next call's first blocks
  ring_.leave_call_locked();
}

Mat HeadStreamer::acquire_block(int64_t b) {
  auto lk = ring_.lock();
  K3_ASSERT(b >= 0 && b < int64_t(blocks_.size()), "head stream: no such lm_head block");
  ++st_.block_acquires;
  int64_t i;
  while ((i = find_locked(b)) < 0) {
    if (start_read_locked(b, false, b, 1)) continue;
    ring_.wait_next_done_locked(lk);  // every buffer is being read: wait for one
  }
  Buf& s = bufs_[size_t(i)];
  if (ring_.await_slot_locked(lk, s, i)) ++st_.block_hits;
  ++s.pins;
  s.last_use = ++tick_;
  // The next blocks (or the next call's first) while this one computes, in the other buffers.
  read_ahead_locked(b + 1, int64_t(bufs_.size()) - 1);
  const uint8_t* base = ring_.slot(i);
  const Block& blk = blocks_[size_t(b)];
  if (in_place_) return Mat::from_bf16(reinterpret_cast<const uint16_t*>(base + blk.skip));
  return Mat(reinterpret_cast<const float*>(base + align_up(blk.len, 64)));
}

void HeadStreamer::release_block(int64_t b) {
  auto lk = ring_.lock();
  const int64_t i = find_locked(b);
  K3_ASSERT(i >= 0 && bufs_[size_t(i)].pins > 0, "head stream: release of a block not acquired");
  --bufs_[size_t(i)].pins;
  read_ahead_locked(b + 1, int64_t(bufs_.size()));  // its buffer is free for the block after
}

void HeadStreamer::wait_idle() { ring_.wait_idle(); }

HeadStats HeadStreamer::stats() const {
  const auto lk = ring_.lock();
  HeadStats out = st_;
  const RingReadStats& r = ring_.stats_locked();
  out.reads = r.reads, out.device_bytes = r.device_bytes, out.io_seconds = r.io_seconds, out.wait_seconds = r.wait_seconds;
  return out;
}

void HeadStreamer::reset_stats() {
  const auto lk = ring_.lock();
  st_ = HeadStats{};
  ring_.stats_locked() = RingReadStats{};
}

std::string head_stats_line(const HeadStreamer& h) {
  const HeadStats st = h.stats();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "head stream: %lld embedding rows read (%.1f MB); lm_head %lld blocks x %lld rows through %lld buffers of "
                "%.1f MB: %lld blocks acquired (%lld already read), %lld block reads, %.3f GB (%.3f GB from disk; %lld "
                "reads in all, %.2f s in pread); compute waited %.2f s",
                (long long)st.embed_rows, double(st.embed_device_bytes) / 1e6, (long long)h.blocks(),
                (long long)h.block_rows(), (long long)h.buffers(), double(h.buffer_bytes()) / 1e6,
                (long long)st.block_acquires, (long long)st.block_hits, (long long)st.block_reads,
                double(st.payload_bytes) / 1e9, double(st.device_bytes) / 1e9, (long long)st.reads, st.io_seconds,
                st.wait_seconds);
  return buf;
}

}  // namespace k3
