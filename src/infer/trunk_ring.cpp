// The dense trunk streamed layer by layer through a ring of owned slots (see trunk_ring.h).
#include "infer/trunk_ring.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "core/dtype.h"
#include "core/error.h"
#include "infer/direct_io.h"
#include "model/k3_model.h"

namespace k3 {

namespace {

constexpr uint64_t kAlign = 4096;              // O_DIRECT granularity; also used buffered (same slot layout)

// Bytes the loader holds for a trunk tensor that is not streamed: bf16 matrices as stored with
// dense_as_stored (its bf16_held rule, model/checkpoint.cpp), everything else f32.
uint64_t held_bytes(const CheckpointReader& ck, const ParamSpec& s, bool dense_as_stored) {
  const bool bf16 = dense_as_stored && s.shape.size() == 2 && s.shape[0] >= 2 && s.shape[1] >= 2 && ck.has(s.name) &&
                    ck.info(s.name).dtype == DType::BF16 && ck.info(s.name).shape == s.shape;
  return uint64_t(s.numel()) * (bf16 ? 2 : 4);
}

}  // namespace

std::vector<TrunkRing::Layer> TrunkRing::locate(const CheckpointReader& ck, const K3Config& cfg, bool dense_as_stored,
                                                std::vector<std::string>* files) {
  std::map<std::string, int> file_ix;
  std::vector<Layer> layers(size_t(cfg.num_hidden_layers));
  for (const ParamSpec& s : k3_param_specs(cfg)) {
    if (!is_streamable_layer_matrix(s)) continue;
    const TensorInfo& ti = ck.info(s.name);
    if (ti.shape != s.shape)
      fail_input(ti.file, s.name, "shape " + shape_str(ti.shape) + ", expected " + shape_str(s.shape));
    if (ti.dtype != DType::F32 && ti.dtype != DType::BF16 && ti.dtype != DType::F16)
      fail_input(ti.file, s.name, std::string("dtype ") + dtype_name(ti.dtype) + ", expected f32, bf16 or f16");
    auto it = file_ix.emplace(ti.file, int(file_ix.size())).first;
    Part p;
    p.name = s.name;
    p.file = it->second;
    p.offset = ti.offset;
    p.nbytes = ti.nbytes;
    p.dtype = ti.dtype;
    p.numel = s.numel();
    p.in_place = dense_as_stored && ti.dtype == DType::BF16;
    layers[size_t(s.layer)].parts.push_back(p);
  }
  for (Layer& L : layers) {
    std::sort(L.parts.begin(), L.parts.end(), [](const Part& a, const Part& b) {
      return a.file != b.file ? a.file < b.file : a.offset < b.offset;
    });
    // Runs: one read per group of matrices close together in one file, each widened to
    // 4096-byte boundaries and landing at a 4096-aligned slot offset, so a bf16 matrix used in
    // place keeps the alignment it has in the file (as a mapped view would).
    uint64_t slot = 0;
    for (size_t i = 0; i < L.parts.size();) {
      size_t j = i + 1;
      uint64_t end = L.parts[i].offset + L.parts[i].nbytes;
      while (j < L.parts.size() && L.parts[j].file == L.parts[i].file && L.parts[j].offset <= end + kMaxReadGap) {
        end = std::max(end, L.parts[j].offset + L.parts[j].nbytes);
        ++j;
      }
      Run r;
      r.file = L.parts[i].file;
      r.start = align_down(L.parts[i].offset, kAlign);
      r.len = align_up(end, kAlign) - r.start;
      r.need = end - r.start;
      r.slot_off = slot;
      r.first_part = i;
      for (size_t q = i; q < j; ++q) L.parts[q].raw_off = slot + (L.parts[q].offset - r.start);
      slot += r.len;
      L.device += r.len;
      L.runs.push_back(r);
      i = j;
    }
    // The f32 area: matrices the resident model holds in f32 (64-byte aligned like its buffer).
    for (Part& p : L.parts) {
      L.payload += p.nbytes;
      if (p.in_place) continue;
      slot = align_up(slot, 64);
      p.f32_off = slot;
      slot += uint64_t(p.numel) * 4;
    }
    L.bytes = slot;
    for (size_t q = 0; q < L.parts.size(); ++q) L.by_name[L.parts[q].name] = q;
  }
  if (files) {
    files->assign(file_ix.size(), "");
    for (const auto& [f, i] : file_ix) (*files)[size_t(i)] = f;
  }
  return layers;
}

TrunkRingPlan TrunkRing::measure(const CheckpointReader& ck, const K3Config& cfg, bool dense_as_stored,
                                 int64_t slots) {
  TrunkRingPlan p;
  p.slots = slots;
  const std::vector<Layer> layers = locate(ck, cfg, dense_as_stored, nullptr);
  for (const Layer& L : layers) {
    p.layer_slot.push_back(align_up(std::max<uint64_t>(L.bytes, 1), kAlign));
    p.layer_read.push_back(L.device);
    p.layer_payload.push_back(L.payload);
  }
  p.layer_held.assign(layers.size(), 0);
  for (const ParamSpec& s : k3_param_specs(cfg)) {
    if (s.component == Component::RoutedExperts) continue;
    if (is_streamable_layer_matrix(s)) p.layer_held[size_t(s.layer)] += held_bytes(ck, s, dense_as_stored);
    else p.resident_bytes += held_bytes(ck, s, dense_as_stored);
  }
  const uint64_t resident = p.resident_bytes;
  p = p.pinned_prefix(0);
  p.resident_bytes = resident;
  return p;
}

TrunkRing::TrunkRing(const CheckpointReader& ck, const WeightStore& store, const TrunkRingOptions& opt)
    : cfg_(store.config()), opt_(opt) {
  K3_ASSERT(opt.slots >= 1, "trunk ring: needs at least one slot");
  K3_ASSERT(opt.pinned >= 0 && opt.pinned < cfg_.num_hidden_layers, "trunk ring: pins every layer or fewer than none");
  std::vector<std::string> files;
  layers_ = locate(ck, cfg_, opt.dense_as_stored, &files);
  for (int64_t l = 0; l < opt.pinned; ++l) layers_[size_t(l)] = Layer{};  // held by the store, never read
  const ParamLayout& lay = store.layout();
  for (size_t i = 0; i < lay.size(); ++i) {
    const ParamSpec& s = lay.spec(i);
    if (s.layer < opt.pinned || s.component == Component::RoutedExperts) continue;
    if (lay.streamed(i)) continue;
    K3_ASSERT(!is_streamable_layer_matrix(s), "trunk ring: the store holds a layer matrix it should stream: " + s.name);
    layers_[size_t(s.layer)].held[s.name] = store.mat(i);
  }
  ring_.open_files(files, opt.direct, opt.require_direct, !opt.direct);
  uint64_t slot_bytes = 0;
  for (const Layer& L : layers_) slot_bytes = std::max(slot_bytes, L.bytes);
  slot_bytes = align_up(std::max<uint64_t>(slot_bytes, 1), kAlign);
  ring_.map_arena(opt.slots, slot_bytes, 0, "the trunk ring arena");
  slots_.resize(size_t(opt.slots));
  views_.resize(size_t(opt.slots));
  ring_.start([this](int64_t slot) { read_layer(slot); },
              [this](int64_t slot, const std::string& error) { layer_read_locked(slot, error); });
}

TrunkRing::~TrunkRing() = default;

// The slot's layer is set before the read is queued and stays while it is Reading, so the I/O
// thread reads it without the lock.
void TrunkRing::read_layer(int64_t slot) {
  const int64_t layer = slots_[size_t(slot)].layer;
  const Layer& L = layers_[size_t(layer)];
  uint8_t* base = ring_.slot(slot);
  for (const Run& r : L.runs) {
    auto what = [&](uint64_t got) {
      // The matrix the failing byte belongs to (or the first of the run).
      size_t q = r.first_part;
      for (size_t k = r.first_part; k < L.parts.size() && L.parts[k].file == r.file; ++k)
        if (L.parts[k].offset <= r.start + got) q = k;
      return "the trunk of layer " + std::to_string(layer) + " (" + L.parts[q].name + ", a read of " +
             std::to_string(r.need) + " bytes from offset " + std::to_string(r.start) + ") from " +
             ring_.file(r.file) + " at offset " + std::to_string(r.start + got);
    };
    ring_.read(r.file, base + r.slot_off, r.start, r.len, r.need, opt_.pread_hook, what);
  }
  // Matrices held in f32 by the resident model: converted as the loader does (exact widening).
  for (const Part& p : L.parts) {
    if (p.in_place) continue;
    const uint8_t* src = base + p.raw_off;
    float* dst = reinterpret_cast<float*>(base + p.f32_off);
    switch (p.dtype) {
      case DType::F32: std::memcpy(dst, src, size_t(p.numel) * 4); break;
      case DType::BF16: bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, size_t(p.numel)); break;
      case DType::F16: f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, size_t(p.numel)); break;
      default: K3_ASSERT(false, "trunk ring: not a float dtype");
    }
  }
}

void TrunkRing::layer_read_locked(int64_t slot, const std::string& error) {
  Slot& s = slots_[size_t(slot)];
  ++st_.layer_reads;
  if (error.empty()) st_.payload_bytes += layers_[size_t(s.layer)].payload;
  s.state = Slot::Ready;  // with an error: acquire reports it and empties the slot
  s.error = error;
  s.bound = -1;
}

int64_t TrunkRing::find_locked(int64_t layer) const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].layer == layer && slots_[i].state != Slot::Empty) return int64_t(i);
  return -1;
}

bool TrunkRing::start_read_locked(int64_t layer, bool ahead) {
  // A free slot: not pinned, not being read; an empty one first, else the least recently used.
  int64_t best = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.pins > 0 || s.state == Slot::Reading) continue;
    if (best < 0 || (s.state == Slot::Empty && slots_[size_t(best)].state != Slot::Empty) ||
        (s.state == slots_[size_t(best)].state && s.last_use < slots_[size_t(best)].last_use))
      best = int64_t(i);
  }
  if (best < 0) return false;
  Slot& s = slots_[size_t(best)];
  s.layer = layer;
  s.state = Slot::Reading;
  s.error.clear();
  s.bound = -1;
  s.ahead = ahead;
  ring_.queue_locked(best);
  return true;
}

void TrunkRing::begin_call() {
  auto lk = ring_.lock();
  ring_.enter_call_locked(lk);  // another thread's forward: wait for its end
}

void TrunkRing::end_call() {
  auto lk = ring_.lock();
  for (Slot& s : slots_) s.pins = 0;  // a call that threw may still hold its layer
  // The next call starts at layer 0 (a normal call has asked for it already; one that threw
  // may have asked for a layer no call needs next).
  wanted_ = -1;
  if (find_locked(opt_.pinned) < 0) start_read_locked(opt_.pinned, true);
  ring_.leave_call_locked();
}

void TrunkRing::prefetch(int64_t layer) {
  auto lk = ring_.lock();
  K3_ASSERT(layer >= opt_.pinned && layer < int64_t(layers_.size()), "trunk ring: no such streamed layer");
  if (find_locked(layer) >= 0) return;
  if (!start_read_locked(layer, true)) wanted_ = layer;  // started when a slot is released
}

LayerWeights& TrunkRing::acquire(int64_t layer) {
  auto lk = ring_.lock();
  K3_ASSERT(layer >= opt_.pinned && layer < int64_t(layers_.size()), "trunk ring: no such streamed layer");
  ++st_.acquires;
  int64_t slot;
  while ((slot = find_locked(layer)) < 0) {
    if (wanted_ == layer) wanted_ = -1;
    if (start_read_locked(layer, false)) continue;
    ring_.wait_next_done_locked(lk);  // every slot is being read (a read started before an error): wait for one
  }
  Slot& s = slots_[size_t(slot)];
  if (ring_.await_slot_locked(lk, s, slot)) ++st_.hits;
  ++s.pins;
  s.last_use = ++tick_;
  if (s.bound != layer) bind(slot);
  return views_[size_t(slot)];
}

void TrunkRing::release(int64_t layer) {
  auto lk = ring_.lock();
  const int64_t slot = find_locked(layer);
  K3_ASSERT(slot >= 0 && slots_[size_t(slot)].pins > 0, "trunk ring: release of a layer not acquired");
  --slots_[size_t(slot)].pins;
  if (wanted_ >= 0 && find_locked(wanted_) < 0 && start_read_locked(wanted_, true)) wanted_ = -1;
}

void TrunkRing::bind(int64_t slot) {
  Slot& s = slots_[size_t(slot)];
  const Layer& L = layers_[size_t(s.layer)];
  uint8_t* base = ring_.slot(slot);
  auto P = [&](const std::string& name) -> Mat {
    if (auto it = L.by_name.find(name); it != L.by_name.end()) {
      const Part& p = L.parts[it->second];
      if (p.in_place) return Mat::from_bf16(reinterpret_cast<const uint16_t*>(base + p.raw_off));
      return Mat(reinterpret_cast<const float*>(base + p.f32_off));
    }
    auto h = L.held.find(name);
    K3_ASSERT(h != L.held.end(), "trunk ring: no view for " + name);
    return h->second;
  };
  views_[size_t(slot)] = bind_layer_weights(cfg_, s.layer, P);
  s.bound = s.layer;
}

void TrunkRing::wait_idle() { ring_.wait_idle(); }

TrunkStats TrunkRing::stats() const {
  const auto lk = ring_.lock();
  TrunkStats out = st_;
  const RingReadStats& r = ring_.stats_locked();
  out.reads = r.reads, out.device_bytes = r.device_bytes, out.io_seconds = r.io_seconds, out.wait_seconds = r.wait_seconds;
  return out;
}

void TrunkRing::reset_stats() {
  const auto lk = ring_.lock();
  st_ = TrunkStats{};
  ring_.stats_locked() = RingReadStats{};
}

std::string trunk_stats_line(const TrunkRing& r) {
  const TrunkStats st = r.stats();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "trunk ring: %lld slots x %.1f MB, %lld layers pinned; %lld layers acquired (%lld already read), %lld layer reads, %.3f GB "
                "of matrices (%.3f GB from disk in %lld reads, %.2f s in pread, %.2f GB/s); compute waited %.2f s (%.0f %% of "
                "the read time overlapped compute)",
                (long long)r.slots(), double(r.slot_bytes()) / 1e6, (long long)r.first_streamed(), (long long)st.acquires, (long long)st.hits,
                (long long)st.layer_reads, double(st.payload_bytes) / 1e9, double(st.device_bytes) / 1e9,
                (long long)st.reads, st.io_seconds,
                st.io_seconds > 0 ? double(st.device_bytes) / st.io_seconds / 1e9 : 0.0, st.wait_seconds,
                st.io_seconds > 0 ? 100.0 * std::max(0.0, 1 - st.wait_seconds / st.io_seconds) : 0.0);
  return buf;
}

}  // namespace k3
