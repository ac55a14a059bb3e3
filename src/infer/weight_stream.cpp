// Expert streaming from the checkpoint into an owned expert cache (see weight_stream.h).
#include "infer/weight_stream.h"

#include <fcntl.h>
#include <malloc.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "core/error.h"
#include "infer/direct_io.h"
#include "model/param_specs.h"

namespace k3 {

namespace {

constexpr uint64_t kDirectAlign = 4096;

std::string gb(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GB", b / 1e9);
  return buf;
}

const char* kPartSuffix[6] = {"w1.weight_packed", "w1.weight_scale", "w3.weight_packed",
                              "w3.weight_scale",  "w2.weight_packed", "w2.weight_scale"};

}  // namespace

IoMode parse_io_mode(const std::string& s) {
  if (s == "auto") return IoMode::Auto;
  if (s == "direct") return IoMode::Direct;
  if (s == "buffered") return IoMode::Buffered;
  fail("--io: expected auto, direct or buffered, got '" + s + "'");
}

std::vector<ExpertStreamer::Loc> ExpertStreamer::locate(const CheckpointReader& ck, const K3Config& cfg,
                                                        std::vector<std::string>* files, uint64_t align,
                                                        uint64_t* slot_bytes, uint64_t* expert_bytes) {
  std::map<std::string, int> file_ix;
  std::vector<Loc> locs;
  uint64_t max_slot = 0, max_payload = 0;
  for (int64_t layer = 0; layer < cfg.num_hidden_layers; ++layer) {
    if (!cfg.is_moe_layer(layer)) continue;
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      Loc loc;
      loc.layer = layer;
      loc.expert = e;
      const std::string base = layer_prefix(layer) + "block_sparse_moe.experts." + std::to_string(e) + ".";
      uint64_t payload = 0;
      for (int w = 0; w < 6; ++w) {
        const TensorInfo& ti = ck.info(base + kPartSuffix[w]);
        auto [it, fresh] = file_ix.emplace(ti.file, int(file_ix.size()));
        if (w == 0) loc.file = it->second;
        else if (it->second != loc.file)
          fail_input(ti.file, ti.name, "lies in another file than " + base + kPartSuffix[0] +
                                           " (memory-limited inference reads one expert from one file)");
        (void)fresh;
        Part p;
        p.offset = ti.offset;
        p.nbytes = ti.nbytes;
        p.which = w;
        loc.parts.push_back(p);
        payload += ti.nbytes;
      }
      std::sort(loc.parts.begin(), loc.parts.end(), [](const Part& a, const Part& b) { return a.offset < b.offset; });
      uint64_t slot = 0;
      for (size_t i = 0; i < loc.parts.size();) {
        size_t j = i + 1;
        uint64_t end = loc.parts[i].offset + loc.parts[i].nbytes;
        while (j < loc.parts.size() && loc.parts[j].offset <= end + kMaxReadGap) {
          end = std::max(end, loc.parts[j].offset + loc.parts[j].nbytes);
          ++j;
        }
        Run r;
        r.start = align_down(loc.parts[i].offset, align);
        r.len = align_up(end, align) - r.start;
        r.need = end - r.start;
        r.slot_off = slot;
        r.first_part = int(i);
        for (size_t q = i; q < j; ++q) loc.parts[q].slot_off = slot + (loc.parts[q].offset - r.start);
        slot += r.len;
        loc.runs.push_back(r);
        i = j;
      }
      max_slot = std::max(max_slot, slot);
      max_payload = std::max(max_payload, payload);
      locs.push_back(std::move(loc));
    }
  }
  if (files) {
    files->assign(file_ix.size(), "");
    for (const auto& [f, i] : file_ix) (*files)[size_t(i)] = f;
  }
  if (slot_bytes) *slot_bytes = align_up(std::max<uint64_t>(max_slot, 1), kDirectAlign);
  if (expert_bytes) *expert_bytes = max_payload;
  return locs;
}

void ExpertStreamer::measure(const CheckpointReader& ck, const K3Config& cfg, uint64_t* slot_bytes,
                             uint64_t* expert_bytes) {
  locate(ck, cfg, nullptr, kDirectAlign, slot_bytes, expert_bytes);
}

ExpertStreamer::ExpertStreamer(const CheckpointReader& ck, const K3Config& cfg, int64_t slots,
                               const StreamOptions& opt)
    : cfg_(cfg), opt_(opt), E_(cfg.num_experts), slots_(slots) {
  K3_ASSERT(slots >= 1, "expert streamer: needs at least one slot");
  // Open the files first: O_DIRECT decides the read alignment.
  {
    std::vector<std::string> files;
    locate(ck, cfg, &files, 1, nullptr, nullptr);
    ring_.open_files(files, opt.io != IoMode::Buffered, opt.io == IoMode::Direct, opt.io == IoMode::Buffered);
  }
  align_ = ring_.direct() ? kDirectAlign : 1;
  uint64_t slot_bytes = 0;
  locs_ = locate(ck, cfg, nullptr, align_, &slot_bytes, &expert_bytes_);
  moe_index_.assign(size_t(cfg.num_hidden_layers), -1);
  for (int64_t l = 0, m = 0; l < cfg.num_hidden_layers; ++l)
    if (cfg.is_moe_layer(l)) moe_index_[size_t(l)] = m++;

  ring_.map_arena(slots_, slot_bytes, 0, "the expert cache arena");
  views_.resize(size_t(slots_));
  reading_.resize(size_t(slots_));
  index_ = ExpertCacheIndex(slots_, opt.policy, int64_t(locs_.size()));
  group_target_ = std::max(1, std::min(2 * omp_get_max_threads(), int(std::max<int64_t>(1, slots_ / 2))));
  ring_.start([this](int64_t slot) { read_job(slot); },
              [this](int64_t slot, const std::string& error) { job_read_locked(slot, error); });
}

ExpertStreamer::~ExpertStreamer() = default;

void ExpertStreamer::bind_views(int64_t slot, int64_t key) {
  const Loc& loc = locs_[size_t(key)];
  SlotViews& v = views_[size_t(slot)];
  uint8_t* base = ring_.slot(slot);
  const int64_t F = cfg_.moe_intermediate_size, l = cfg_.routed_expert_hidden_size;
  const int64_t rows[3] = {F, F, l}, cols[3] = {l, l, F};
  for (const Part& p : loc.parts) {
    const int m = p.which / 2;
    const bool scales = p.which % 2;
    Tensor t = Tensor::view_of(DType::U8, scales ? Shape{rows[m], cols[m] / 32} : Shape{rows[m], cols[m] / 2},
                               base + p.slot_off, nullptr);
    if (scales) v.m[m].scales = std::move(t);
    else v.m[m].packed = std::move(t);
    v.m[m].rows = rows[m];
    v.m[m].cols = cols[m];
  }
  for (int m = 0; m < 3; ++m) v.em[m] = ExpertMatrix{nullptr, &v.m[m], rows[m], cols[m]};
}

// The slot's job is set when it is admitted and stays until the read is done (the slot is
// pinned), so the I/O thread reads it without the lock.
void ExpertStreamer::read_job(int64_t slot) {
  const Job& j = reading_[size_t(slot)];
  const Loc& loc = locs_[size_t(j.key)];
  uint8_t* base = ring_.slot(j.slot);
  for (const Run& r : loc.runs) {
    auto what = [&](uint64_t got) {
      return "routed expert " + std::to_string(loc.expert) + " of layer " + std::to_string(loc.layer) + " (" +
             layer_prefix(loc.layer) + "block_sparse_moe.experts." + std::to_string(loc.expert) + "." +
             kPartSuffix[loc.parts[size_t(r.first_part)].which] + " and the rest of the read, " +
             std::to_string(r.need) + " bytes from offset " + std::to_string(r.start) + ") from " +
             ring_.file(loc.file) + " at offset " + std::to_string(r.start + got);
    };
    ring_.read(loc.file, base + r.slot_off, r.start, r.len, r.need, opt_.pread_hook, what);
  }
}

void ExpertStreamer::job_read_locked(int64_t slot, const std::string& error) {
  const Job j = reading_[size_t(slot)];
  if (error.empty()) {
    uint64_t payload = 0;
    for (const Part& p : locs_[size_t(j.key)].parts) payload += p.nbytes;
    st_.payload_bytes += payload;
    ready_.push_back(j);
  } else {
    if (error_.empty()) error_ = error;
    index_.unpin(j.slot);
    index_.erase(j.key);  // the slot's bytes are not that expert's: never a hit
  }
}

void ExpertStreamer::admit_locked() {
  while (!pending_.empty()) {
    Job j = pending_.front();
    const int64_t s = index_.insert(j.key);
    if (s < 0) break;
    index_.pin(s);
    j.slot = s;
    pending_.pop_front();
    reading_[size_t(s)] = j;
    ring_.queue_locked(s);
  }
}

void ExpertStreamer::abort_locked(std::unique_lock<std::mutex>& lk) {
  // Drop what is not read yet, wait for the read in progress, release every pin of the call.
  for (const int64_t slot : ring_.drop_queued_locked()) {
    const Job& j = reading_[size_t(slot)];
    index_.unpin(j.slot);
    index_.erase(j.key);
  }
  pending_.clear();
  ring_.wait_locked(lk, [&] { return ring_.outstanding_locked() == 0; });
  for (const Job& j : ready_) index_.unpin(j.slot);
  for (const Job& j : handed_) index_.unpin(j.slot);
  ready_.clear();
  handed_.clear();
  ring_.leave_call_locked();
}

void ExpertStreamer::prefetch(int64_t layer, const int32_t* experts, int64_t n) {
  auto lk = ring_.lock();
  if (ring_.call_is_mine_locked()) abort_locked(lk);  // this thread's earlier call was unwound by an error
  ring_.enter_call_locked(lk);                         // another thread's call: wait for its finish
  error_.clear();
  K3_ASSERT(layer >= 0 && layer < int64_t(moe_index_.size()) && moe_index_[size_t(layer)] >= 0,
            "expert streamer: not a MoE layer");
  layer_ = layer;
  ++st_.calls;
  st_.experts_requested += n;
  const int64_t mi = moe_index_[size_t(layer)];
  std::vector<Job> miss;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = mi * E_ + experts[i];
    const int64_t s = index_.find(key);
    if (s >= 0) {
      index_.pin(s);
      ready_.push_back({key, s, experts[i]});
      ++st_.hits;
    } else {
      miss.push_back({key, -1, experts[i]});
      ++st_.misses;
    }
  }
  // Reads in file order (one sequential sweep per call).
  std::sort(miss.begin(), miss.end(), [&](const Job& a, const Job& b) {
    const Loc &la = locs_[size_t(a.key)], &lb = locs_[size_t(b.key)];
    return la.file != lb.file ? la.file < lb.file : la.runs[0].start < lb.runs[0].start;
  });
  pending_.assign(miss.begin(), miss.end());
  admit_locked();
}

ExpertGroup ExpertStreamer::next() {
  auto lk = ring_.lock();
  K3_ASSERT(ring_.in_call_locked(), "expert streamer: next() outside a call");
  for (const Job& j : handed_) index_.unpin(j.slot);
  handed_.clear();
  admit_locked();
  const int64_t outstanding = ring_.outstanding_locked();
  if (ready_.empty() && outstanding == 0 && pending_.empty() && error_.empty()) return {};
  const size_t target = size_t(std::min<int64_t>(group_target_, int64_t(ready_.size()) + outstanding));
  if (ready_.size() < std::max<size_t>(target, 1) && error_.empty())
    ring_.wait_timed_locked(lk, [&] { return !error_.empty() || ready_.size() >= std::max<size_t>(target, 1); });
  if (!error_.empty()) {
    const std::string e = error_;
    abort_locked(lk);
    error_.clear();
    fail(e);
  }
  handed_.swap(ready_);
  ready_.clear();
  const size_t n = handed_.size();
  g_experts_.resize(n);
  g_w1_.resize(n);
  g_w3_.resize(n);
  g_w2_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Job& j = handed_[i];
    bind_views(j.slot, j.key);
    const SlotViews& v = views_[size_t(j.slot)];
    g_experts_[i] = j.expert;
    g_w1_[i] = v.em[0];
    g_w3_[i] = v.em[1];
    g_w2_[i] = v.em[2];
  }
  return {g_experts_.data(), g_w1_.data(), g_w3_.data(), g_w2_.data(), int64_t(n)};
}

void ExpertStreamer::finish() {
  auto lk = ring_.lock();
  K3_ASSERT(ready_.empty() && pending_.empty() && ring_.outstanding_locked() == 0,
            "expert streamer: finish() before every group");
  for (const Job& j : handed_) index_.unpin(j.slot);
  handed_.clear();
  ring_.leave_call_locked();
}

StreamStats ExpertStreamer::stats() const {
  const auto lk = ring_.lock();
  StreamStats s = st_;
  s.evictions = index_.evictions;
  const RingReadStats& r = ring_.stats_locked();
  s.reads = r.reads, s.device_bytes = r.device_bytes, s.io_seconds = r.io_seconds, s.wait_seconds = r.wait_seconds;
  return s;
}

void ExpertStreamer::reset_stats() {
  const auto lk = ring_.lock();
  st_ = StreamStats{};
  index_.evictions = 0;
  ring_.stats_locked() = RingReadStats{};
}

std::string stream_stats_line(const ExpertStreamer& s) {
  const StreamStats st = s.stats();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "stream: %lld MoE calls, %lld experts requested, hit rate %.3f (%lld hits, %lld misses, %lld "
                "evictions); read %s of experts (%s from disk in %lld reads, %.2f s in pread, %.2f GB/s); compute "
                "waited %.2f s",
                (long long)st.calls, (long long)st.experts_requested, st.hit_rate(), (long long)st.hits,
                (long long)st.misses, (long long)st.evictions, gb(double(st.payload_bytes)).c_str(),
                gb(double(st.device_bytes)).c_str(), (long long)st.reads, st.io_seconds,
                st.io_seconds > 0 ? double(st.device_bytes) / st.io_seconds / 1e9 : 0.0, st.wait_seconds);
  return buf;
}

double probe_read_bandwidth(const std::string& path, uint64_t bytes, std::string* how) {
  struct stat sb{};
  if (::stat(path.c_str(), &sb) != 0) fail_system("cannot stat", path);
  const uint64_t size = uint64_t(sb.st_size);
  const uint64_t block = uint64_t(8) << 20;
  bytes = std::min(bytes, align_down(size, kDirectAlign));
  if (bytes < kDirectAlign) {
    if (how) *how = "file too small to measure";
    return 0;
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  bool direct = fd >= 0;
  if (!direct) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_system("cannot open", path);
  const uint64_t start = align_down((size - bytes) / 2, kDirectAlign);
  if (!direct) ::posix_fadvise(fd, off_t(start), off_t(bytes), POSIX_FADV_DONTNEED);
  void* buf = nullptr;
  if (::posix_memalign(&buf, kDirectAlign, block) != 0) {
    ::close(fd);
    fail("probe_read_bandwidth: out of memory");
  }
  const double t0 = steady_seconds();
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, buf, size_t(std::min(block, align_up(bytes - done, kDirectAlign))), off_t(start + done));
    if (n <= 0) break;
    done += uint64_t(n);
  }
  const double dt = steady_seconds() - t0;
  std::free(buf);
  ::close(fd);
  if (how) {
    char b[160];
    std::snprintf(b, sizeof b, "%s read of %.0f MB of %s", direct ? "O_DIRECT" : "buffered (O_DIRECT refused)",
                  double(done) / 1e6, path.c_str());
    *how = b;
  }
  return dt > 0 ? double(done) / dt : 0;
}

namespace {
InferenceModel load_budgeted_model(const ModelDir& md, const LoadOptions& opt, const StreamOptions& so,
                                   double disk_bytes_per_s);
}  // namespace

InferenceModel load_inference_model(const ModelDir& md, const LoadOptions& opt, const StreamOptions& so,
                                    double disk_bytes_per_s) {
  if (opt.ram_budget_bytes == 0) return InferenceModel{load_model(md, opt), nullptr, {}, 0, "", nullptr, nullptr};
  if (opt.backend && opt.backend->device())
    fail("--ram-budget streams weights from disk, which only the CPU backend does; on " +
         opt.backend->device()->name() + " the whole model must fit in device memory (omit --ram-budget)");
  InferenceModel im = load_budgeted_model(md, opt, so, disk_bytes_per_s);
#ifdef __GLIBC__
  // The checkpoint's index (the header's JSON tree, the tensor table) is freed by now: give
  // its pages back, or they stay in RssAnon for the whole run (planner.h working_bytes_estimate).
  ::malloc_trim(0);
#endif
  return im;
}

namespace {

InferenceModel load_budgeted_model(const ModelDir& md, const LoadOptions& opt, const StreamOptions& so,
                                   double disk_bytes_per_s) {
  const CheckpointReader ck = CheckpointReader::open(md.dir);
  if (ck.size() == 0) fail_input(md.dir, "", "no safetensors files in the model directory");
  const K3Config& cfg = md.config;
  // The budget check comes before any weight is read: the trunk as it will be held (bf16
  // matrices as stored with dense_as_stored, everything else f32), the reserve, two slots.
  uint64_t trunk = 0;
  for (const ParamSpec& s : k3_param_specs(cfg)) {
    if (s.component == Component::RoutedExperts) continue;
    const bool bf16 = opt.dense_as_stored && s.shape.size() == 2 && s.shape[0] >= 2 && s.shape[1] >= 2 &&
                      ck.has(s.name) && ck.info(s.name).dtype == DType::BF16 && ck.info(s.name).shape == s.shape;
    trunk += uint64_t(s.numel()) * (bf16 ? 2 : 4);
  }
  uint64_t slot_bytes = 0, expert_bytes = 0;
  for (const ParamSpec& s : k3_param_specs(cfg))
    if (s.component == Component::RoutedExperts && !ck.has(mxfp4_packed_name(s.name)))
      fail_input(ck.path(), "--ram-budget",
                 "memory-limited inference streams MXFP4 routed experts; " + s.name + " is not stored as MXFP4");
  ExpertStreamer::measure(ck, cfg, &slot_bytes, &expert_bytes);
  if (disk_bytes_per_s <= 0) {
    std::string how;
    const std::string probe_file = ck.info(layer_prefix(cfg.first_k_dense_replace) +
                                           "block_sparse_moe.experts.0.w1.weight_packed").file;
    disk_bytes_per_s = probe_read_bandwidth(probe_file, uint64_t(256) << 20, &how);
    std::fprintf(stderr, "disk: %.2f GB/s (%s)\n", disk_bytes_per_s / 1e9, how.c_str());
  }
  const uint64_t reserve =
      so.working_reserve_bytes ? so.working_reserve_bytes : working_bytes_estimate(cfg, so.tokens_per_call);
  const TrunkRingPlan ring_sizes = TrunkRing::measure(ck, cfg, opt.dense_as_stored, 0);
  HeadStreamOptions ho;
  ho.block_rows = so.head_block_rows;
  ho.buffers = so.head_buffers;
  ho.dense_as_stored = opt.dense_as_stored;
  ho.direct = so.io != IoMode::Buffered;
  ho.require_direct = so.io == IoMode::Direct;
  ho.pread_hook = so.head_pread_hook;
  const HeadStreamPlan head_sizes = HeadStreamer::measure(ck, cfg, ho);
  StreamProjection plan = plan_streaming(cfg, opt.ram_budget_bytes, disk_bytes_per_s, so.tokens_per_call, trunk,
                                         slot_bytes, reserve, ring_sizes, head_sizes, so.stream_trunk, so.trunk_slots,
                                         so.stream_head, so.trunk_pinned);
  if (!plan.fits) {
    const TrunkRingPlan& r = plan.ring;
    const HeadStreamPlan& h = plan.head;
    char head[256] = "";
    if (h.streamed)
      std::snprintf(head, sizeof head, ", the embedding and lm_head streamed through %.3f GB of buffers (held: %.3f GB)",
                    double(h.buffer_bytes) / 1e9, double(h.held_bytes) / 1e9);
    char buf[1280];
    std::snprintf(buf, sizeof buf,
                  "%.3f GB is below the minimum of %.3f GB for this model: the dense trunk streamed through a ring of "
                  "%lld slot%s of %.3f GB (its largest layer; %s) + %.3f GB held (%s)%s, %.3f GB "
                  "working memory and two expert slots of %.1f MB (the whole trunk resident would need %.3f GB)",
                  double(opt.ram_budget_bytes) / 1e9, double(plan.min_budget) / 1e9, (long long)r.slots,
                  r.slots > 1 ? "s" : "", double(r.slot_bytes) / 1e9,
                  r.slots > 1 ? "the next layer is read while one computes"
                              : ("two slots, to read the next layer while one computes, need " +
                                 gb(double(plan.min_budget + r.slot_bytes)))
                                    .c_str(),
                  double(r.resident_bytes - (h.streamed ? std::min(r.resident_bytes, h.held_bytes) : 0)) / 1e9,
                  h.streamed ? "norms and vectors" : "embedding, lm_head, norms", head, double(reserve) / 1e9,
                  double(slot_bytes) / 1e6, double(trunk + reserve + 2 * slot_bytes) / 1e9);
    fail_input(md.dir, "--ram-budget", buf);
  }
  const bool ring = plan.ring.slots > 0;
  const bool head_streamed = plan.head.streamed;
  const uint64_t held = plan.min_budget - reserve - 2 * slot_bytes;  // trunk (or ring) + head as chosen
  int64_t slots = plan.cache_slots;
  if (so.cache_slots > 0) {
    if (held + reserve + uint64_t(so.cache_slots) * slot_bytes > opt.ram_budget_bytes)
      fail_input(md.dir, "--ram-budget", std::to_string(so.cache_slots) + " cache slots do not fit the budget");
    slots = so.cache_slots;
    plan = project_streaming(cfg, held + reserve + uint64_t(slots) * slot_bytes, disk_bytes_per_s,
                             so.tokens_per_call, trunk, slot_bytes, reserve, plan.ring, plan.head);
    plan.budget = opt.ram_budget_bytes;
  }
  LoadOptions lo = opt;
  lo.stream_trunk = ring;
  lo.pinned_layers = ring ? plan.ring.pinned : 0;
  lo.stream_head = head_streamed;
  WeightStore w = load_weights(ck, cfg, lo);
  // The trunk into owned memory: bf16 views of the mapping become copies, so no weight the
  // forward reads is a mapped page, and the mapped pages read while loading are dropped.
  for (size_t i = 0; i < w.layout().size(); ++i)
    if (w.layout().bf16_held(i)) w.set_bf16(i, w.bf16(i).clone());
  InferenceModel im{K3Model(std::move(w)), nullptr, plan, 0, "", nullptr, nullptr};
  if (so.head_block_rows > 0) im.model.set_head_block_rows(so.head_block_rows);
  im.trunk_bytes = uint64_t(im.model.weights().size()) * 4 + uint64_t(im.model.weights().bf16_bytes());
  for (const auto& f : ck.files()) {
    const int fd = ::open(f->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  if (ring) {
    TrunkRingOptions to;
    to.slots = plan.ring.slots;
    to.pinned = plan.ring.pinned;
    to.direct = so.io != IoMode::Buffered;
    to.require_direct = so.io == IoMode::Direct;
    to.dense_as_stored = opt.dense_as_stored;
    to.pread_hook = so.trunk_pread_hook;
    im.trunk = std::make_shared<TrunkRing>(ck, im.model.weights(), to);
    im.model.set_trunk_provider(im.trunk);
    im.trunk->prefetch(plan.ring.pinned);  // the first call's first streamed layer, read while the rest loads
  }
  if (head_streamed) {
    ho.block_rows = im.model.head_block_rows();
    im.head = std::make_shared<HeadStreamer>(ck, cfg, ho);  // reads the first blocks ahead
    im.model.set_head_provider(im.head);
  }
  im.stream = std::make_shared<ExpertStreamer>(ck, cfg, slots, so);
  im.model.set_expert_provider(im.stream);
  const std::string pinned_note =
      ring && plan.ring.pinned > 0 ? " (layers 0-" + std::to_string(plan.ring.pinned - 1) + " pinned: held, never read)"
                                   : std::string();
  im.trunk_note = (ring ? "dense trunk streamed: its layers' matrices" + pinned_note + " through a ring of " +
                              std::to_string(im.trunk->slots()) + " slot" + (im.trunk->slots() > 1 ? "s" : "") +
                              " x " + gb(double(im.trunk->slot_bytes())) + " (" + im.trunk->io_mode() +
                              "), every streamed layer read once per forward call (" + gb(double(plan.ring.pass_bytes)) +
                              "), the rest held in owned memory (" + gb(double(im.trunk_bytes)) + ")"
                        : "dense trunk resident in owned memory (" + gb(double(im.trunk_bytes)) + ")") +
                  (head_streamed ? "; embedding and lm_head streamed: lm_head in " + std::to_string(im.head->blocks()) +
                                       " blocks of " + std::to_string(im.head->block_rows()) + " rows through " +
                                       std::to_string(im.head->buffers()) + " buffers (" +
                                       gb(double(im.head->arena_bytes())) + " with the embedding row buffer, " +
                                       im.head->io_mode() + "), one embedding row read per token"
                                 : std::string()) +
                  "; routed experts streamed: " + std::to_string(slots) + " cache slots (" +
                  gb(double(im.stream->arena_bytes())) + " arena, " + cache_policy_name(so.policy) + "), " +
                  im.stream->io_mode();
  return im;
}

}  // namespace

}  // namespace k3
