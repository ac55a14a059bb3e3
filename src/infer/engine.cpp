// The serving engine's scheduler (see engine.h).
#include "infer/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <pthread.h>
#include <time.h>

#include "core/error.h"
#include "core/threads.h"
#include "infer/prefix_cache.h"
#include "kernels/log_sum_exp.h"

namespace k3 {

using Clock = std::chrono::steady_clock;

static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CPU time of the calling thread: with one compute thread, the work a step did whatever else
// the machine runs.
static double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// ---------------------------------------------------------------------------------------------
// RequestHandle

void RequestHandle::push(GenerationEvent ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

bool RequestHandle::next(GenerationEvent& ev, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return false;
  ev = std::move(events_.front());
  events_.pop_front();
  return true;
}

// ---------------------------------------------------------------------------------------------
// LatencyHistogram

const std::vector<double>& LatencyHistogram::bounds() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
  return b;
}

void LatencyHistogram::observe(double s) {
  const std::vector<double>& b = bounds();
  if (counts.empty()) counts.assign(b.size() + 1, 0);
  const size_t i = size_t(std::lower_bound(b.begin(), b.end(), s) - b.begin());
  ++counts[i];
  sum += s;
  ++total;
}

// ---------------------------------------------------------------------------------------------
// Engine

// Not an anonymous namespace: Engine::Impl (external linkage) holds these types, which GCC
// flags (-Wsubobject-linkage) when this file is compiled inside a unity batch.
namespace engine_parts {

struct Waiting {
  std::shared_ptr<RequestHandle> handle;
  GenerationRequest req;
  Clock::time_point submitted;
};

struct Slot {
  std::shared_ptr<RequestHandle> handle;
  GenerationRequest req;
  Clock::time_point submitted, last_token;
  DecodeState st;
  std::unique_ptr<Sampler> sampler;
  PrefixCache::Node* node = nullptr;  // pinned snapshot at the last chunk boundary (prefill only)
  int64_t cached = 0;                 // prompt tokens restored from the prefix cache
  int64_t generated = 0;
  int32_t pending = -1;               // sampled, to be fed by the next decode step
  bool done = false;
  std::vector<float> row;             // this sequence's logits, masked by its constraint
  bool prefilling() const { return st.n_tokens < int64_t(req.prompt.size()); }
  // What the prefix cache matches: the image-hash key when the prompt has images.
  const int32_t* key() const { return req.cache_key.empty() ? req.prompt.data() : req.cache_key.data(); }
};

// The leader's messages to its followers (StepChannel): the operations that changed its state,
// in the order it made them. Integers are int64 in the host's byte order (every process of a
// job runs the same binary); a vector is its length, then its elements.
enum class Op : uint8_t {
  Admit = 1,     // a request took a slot: prompt, cache key, media id, media rows (if any)
  AdmitBlocked,  // admission stopped on the state budget (after trying to evict snapshots)
  Finish,        // slot index: the sequence ended
  Token,         // slot index, id: the token its next decode step feeds
  Prefill,       // slot index: one prefill chunk of it (a forward)
  Decode,        // one decode step of every slot with a token to feed (a forward)
  Erase,         // ended slots leave `running`
  Stop,          // the leader's engine stopped
};

struct StepWriter {
  std::string& s;
  void op(Op o) { s.push_back(char(o)); }
  void i64(int64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }
  template <class T>
  void vec(const T* p, size_t n) {
    i64(int64_t(n));
    s.append(reinterpret_cast<const char*>(p), n * sizeof(T));
  }
};

struct StepReader {
  const std::string& s;
  size_t pos = 0;
  bool done() const { return pos >= s.size(); }
  void need(size_t n) const {
    if (n > s.size() - pos) fail("engine follower: a truncated message from the leader (" + std::to_string(s.size()) + " bytes)");
  }
  Op op() {
    need(1);
    return Op(uint8_t(s[pos++]));
  }
  int64_t i64() {
    int64_t v = 0;
    need(sizeof v);
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    const int64_t n = i64();
    if (n < 0) fail("engine follower: a negative length in a message from the leader");
    need(size_t(n) * sizeof(T));
    std::vector<T> v(static_cast<size_t>(n));
    if (n) std::memcpy(v.data(), s.data() + pos, size_t(n) * sizeof(T));
    pos += size_t(n) * sizeof(T);
    return v;
  }
};

}  // namespace engine_parts

using namespace engine_parts;

struct Engine::Impl {
  const K3Model& model;
  EngineOptions opt;
  int threads;
  int64_t slot_bytes = 0;  // one sequence at full context: KDA/conv states + MLA latent cache
  PrefixCache cache;

  mutable std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<Waiting> waiting;
  bool stopping = false, draining = false, cancel_running = false;
  EngineStats stats;  // guarded by mu

  // Scheduler-thread state.
  std::vector<std::unique_ptr<Slot>> running;
  ForwardScratch prefill_scratch, decode_scratch;
  std::vector<float> prefill_logits, batch_logits;
  std::vector<int32_t> batch_ids;
  std::vector<int64_t> batch_seg;
  std::vector<DecodeState*> batch_states;
  std::vector<Slot*> batch_slots;
  std::vector<int32_t> top_idx;  // top_logprobs candidates
  std::vector<int64_t> greedy_rows;  // decode_step_on_device: the rows chosen on the backend
  std::vector<int32_t> greedy_ids;
  std::vector<uint8_t> greedy_bad;
  std::thread thread;

  // Replication (StepChannel): the leader notes its decisions in `log` and shares it before
  // each forward; a follower (run_engine_follower) applies them.
  StepChannel* channel = nullptr;
  bool follower = false;
  std::string log;
  Clock::time_point last_share = Clock::now();
  bool leading() const { return channel && !follower; }
  StepWriter note() { return StepWriter{log}; }
  void share() {
    channel->share(log);
    log.clear();
    last_share = Clock::now();
  }
  int64_t index_of(const Slot& s) const {
    for (size_t i = 0; i < running.size(); ++i)
      if (running[i].get() == &s) return int64_t(i);
    K3_ASSERT(false, "engine: a slot outside the running set");
    return -1;
  }

  Impl(const K3Model& m, EngineOptions o)
      : model(m), opt(std::move(o)), threads(num_threads()), cache(m.dims(), opt.prefill_chunk, m.device()), channel(opt.step_channel) {
    const ModelDims& d = model.dims();
    int64_t mla_layers = 0;
    for (bool b : d.mla) mla_layers += b ? 1 : 0;
    slot_bytes = cache.snapshot_bytes() +
                 int64_t(sizeof(float)) * mla_layers * (d.mla_dims.kv_lora + d.mla_dims.rope) * opt.ctx;
    stats.state_budget_bytes = opt.state_budget_mb << 20;
    node_bytes = cache.snapshot_bytes() +
                 int64_t(sizeof(float)) * mla_layers * (d.mla_dims.kv_lora + d.mla_dims.rope) * opt.prefill_chunk +
                 int64_t(sizeof(int32_t)) * opt.prefill_chunk + 256;
    prefill_logits.resize(size_t(d.V));
  }

  int64_t node_bytes = 0;  // one snapshot: KDA/conv states + one chunk of MLA rows (an upper bound)
  int64_t stats_budget() const { return stats.state_budget_bytes; }  // fixed after construction
  int64_t state_bytes() const { return int64_t(running.size()) * slot_bytes + cache.bytes(); }

  void finish(Slot& s, const std::string& reason, const std::string& error = {}) {
    if (leading()) note().op(Op::Finish), note().i64(index_of(s));
    if (s.handle) {  // a follower's slots have none
      GenerationEvent ev;
      ev.final = true;
      ev.finish = reason;
      ev.error = error;
      ev.prompt_tokens = int64_t(s.req.prompt.size());
      ev.cached_tokens = s.cached;
      ev.completion_tokens = s.generated;
      s.handle->push(std::move(ev));
    }
    s.done = true;
    if (s.node) cache.unpin(s.node), s.node = nullptr;
  }

  // Samples the next token of `s` from its logits, emits it, and ends the sequence on a stop
  // token, at max_tokens or at the context limit.
  // greedy_id >= 0: the token was chosen on the model's backend (greedy_on_device), and
  // logits is not read.
  void emit_next(Slot& s, const float* logits, int32_t greedy_id = -1) {
    const int64_t V = model.dims().V;
    int32_t id = -1;
    const std::vector<int32_t>& forced = opt.forced_output;
    bool forced_end = false;
    if (greedy_id >= 0) {
      id = greedy_id;
    } else if (!forced.empty()) {
      if (s.generated < int64_t(forced.size())) id = forced[size_t(s.generated)];
      else if (!s.req.stop_tokens.empty()) id = s.req.stop_tokens[0];
      else forced_end = true;
    } else {
      // Only a constraint needs a copy (it masks in place); the model's row stays intact for
      // the log-probabilities.
      const float* row = logits;
      if (s.req.constraint) {
        s.row.assign(logits, logits + V);
        s.req.constraint->mask(s.row.data(), V);
        row = s.row.data();
      }
      id = s.sampler->sample(row, V);
    }
    if (forced_end) {
      finish(s, "length");
      return;
    }
    if (s.req.constraint) {
      try {
        s.req.constraint->accept(id);
      } catch (const std::exception& e) {  // e.g. a forced token the constraint does not allow
        finish(s, "error", e.what());
        return;
      }
    }
    GenerationEvent ev;
    ev.id = id;
    if (s.req.top_logprobs >= 0) {
      // Log-probabilities of the model's distribution (unmasked, temperature 1), as OpenAI reports.
      const double lz = log_sum_exp(logits, V);
      ev.logprob = float(double(logits[id]) - lz);
      if (s.req.top_logprobs > 0) {
        std::vector<int32_t>& idx = top_idx;  // reused: no allocation per token
        idx.resize(size_t(V));
        for (int64_t i = 0; i < V; ++i) idx[size_t(i)] = int32_t(i);
        const int64_t n = std::min<int64_t>(s.req.top_logprobs, V);
        std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
          return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        for (int64_t i = 0; i < n; ++i)
          ev.top.push_back({idx[size_t(i)], float(double(logits[idx[size_t(i)]]) - lz)});
      }
    }
    const Clock::time_point now = Clock::now();
    ++s.generated;
    {
      std::lock_guard<std::mutex> lk(mu);
      ++stats.generation_tokens_total;
      if (s.generated == 1) stats.ttft.observe(seconds(now - s.submitted));
      else stats.itl.observe(seconds(now - s.last_token));
    }
    if (s.generated == 1) ev.ttft_s = seconds(now - s.submitted);
    s.last_token = now;
    s.handle->push(std::move(ev));
    const bool stop = std::find(s.req.stop_tokens.begin(), s.req.stop_tokens.end(), id) != s.req.stop_tokens.end();
    if (stop) finish(s, "stop");
    else if (s.generated >= s.req.max_tokens || s.st.n_tokens + 1 > opt.ctx) finish(s, "length");
    else {
      s.pending = id;
      if (leading()) note().op(Op::Token), note().i64(index_of(s)), note().i64(id);
    }
  }

  // Room in the state budget for one more slot, evicting unpinned snapshots if needed.
  bool make_room() {
    const int64_t budget = stats.state_budget_bytes;
    const int64_t need = int64_t(running.size() + 1) * slot_bytes;
    return need + cache.bytes() <= budget || cache.shrink_to(budget - need);
  }

  // A slot for `req`, restored from the longest prefix-cache snapshot of its prompt.
  void open_slot(GenerationRequest req, std::shared_ptr<RequestHandle> handle, Clock::time_point submitted) {
    if (leading()) {
      StepWriter w = note();
      w.op(Op::Admit);
      w.vec(req.prompt.data(), req.prompt.size());
      w.vec(req.cache_key.data(), req.cache_key.size());
      w.i64(req.media_id);
      w.i64(req.media_rows ? 1 : 0);
      if (req.media_rows) w.vec(req.media_rows->data(), req.media_rows->size());
    }
    auto s = std::make_unique<Slot>();
    s->handle = std::move(handle);
    s->req = std::move(req);
    s->submitted = submitted;
    s->sampler = std::make_unique<Sampler>(s->req.sampling);
    s->st = model.new_state();
    s->st.reserve(opt.ctx, model.dims());
    const int64_t P = int64_t(s->req.prompt.size());
    // At least the last prompt token is computed: its logits give the first token.
    if (opt.prefix_cache) s->node = cache.restore(s->key(), P - 1, s->st);
    s->cached = s->st.n_tokens;
    ++stats.requests_total;
    stats.prompt_tokens_total += uint64_t(P);
    stats.cached_prompt_tokens_total += uint64_t(s->cached);
    if (opt.prefix_cache) ++(s->cached > 0 ? stats.prefix_cache_hits : stats.prefix_cache_misses);
    running.push_back(std::move(s));
  }

  // Admits waiting requests while a slot and the state budget allow (evicting snapshots).
  // Called with mu held.
  void admit() {
    while (!waiting.empty() && int64_t(running.size()) < opt.parallel) {
      Waiting& w = waiting.front();
      if (w.handle->cancelled()) {
        GenerationEvent ev;
        ev.final = true;
        ev.finish = "cancelled";
        ev.prompt_tokens = int64_t(w.req.prompt.size());
        w.handle->push(std::move(ev));
        waiting.pop_front();
        continue;
      }
      if (!make_room()) {  // wait for a slot to end
        if (leading()) note().op(Op::AdmitBlocked);
        break;
      }
      GenerationRequest req = std::move(w.req);
      std::shared_ptr<RequestHandle> handle = w.handle;
      const Clock::time_point submitted = w.submitted;
      waiting.pop_front();
      open_slot(std::move(req), std::move(handle), submitted);
    }
    stats.running = int64_t(running.size());
    stats.waiting = int64_t(waiting.size());
  }

  // One prefill chunk of `s`: to the next multiple of prefill_chunk (or the prompt's end),
  // so chunk boundaries are the same absolute positions with or without the cache.
  void prefill_chunk(Slot& s) {
    const int64_t P = int64_t(s.req.prompt.size()), C = opt.prefill_chunk;
    const int64_t p = s.st.n_tokens, e = std::min(P, (p / C + 1) * C);
    if (leading()) note().op(Op::Prefill), note().i64(index_of(s)), share();
    ForwardOptions fo;
    fo.mode = MixerMode::Prefill;
    fo.last_only = true;
    // Image rows of this chunk: those of the media positions in [p, e), after the ones before p.
    EmbedSpliceT<float> splice;
    if (s.req.media_rows) {
      const int32_t* ids = s.req.prompt.data();
      const int64_t before = std::count(ids, ids + p, s.req.media_id), in = std::count(ids + p, ids + e, s.req.media_id);
      splice = {s.req.media_id, s.req.media_rows->data() + before * model.dims().d, in, nullptr};
    }
    model.forward(prefill_logits.data(), s.req.prompt.data() + p, e - p, s.st, prefill_scratch, fo, nullptr,
                  s.req.media_rows ? &splice : nullptr);
    if (s.node && e % C == 0) {
      // A snapshot must fit the budget beside the slots; older unpinned ones make room, and
      // when they cannot, this request stops taking snapshots.
      const int64_t room = stats_budget() - int64_t(running.size()) * slot_bytes - node_bytes;
      if (cache.bytes() <= room || cache.shrink_to(room)) {
        s.node = cache.extend(s.node, s.key() + e - C, s.st);
      } else {
        cache.unpin(s.node);
        s.node = nullptr;
      }
    }
    if (e == P) {
      if (s.node) cache.unpin(s.node), s.node = nullptr;
      if (!follower) emit_next(s, prefill_logits.data());
    }
  }

  // One decode step of every sequence that has a token to feed, as one batch.
  void decode_step() {
    batch_ids.clear();
    batch_seg.assign(1, 0);
    batch_states.clear();
    batch_slots.clear();
    for (auto& s : running) {
      if (s->done || s->pending < 0) continue;
      batch_ids.push_back(s->pending);
      batch_seg.push_back(int64_t(batch_ids.size()));
      batch_states.push_back(&s->st);
      batch_slots.push_back(s.get());
    }
    if (batch_slots.empty()) return;
    const int64_t B = int64_t(batch_slots.size()), V = model.dims().V;
    batch_logits.resize(size_t(B * V));
    if (leading()) note().op(Op::Decode), share();
    if (model.device() && !follower) return decode_step_on_device(B, V);
    model.forward_batch(batch_logits.data(), batch_ids.data(), batch_seg.data(), B, batch_states.data(),
                        decode_scratch);
    for (int64_t j = 0; j < B; ++j) {
      Slot& s = *batch_slots[size_t(j)];
      s.pending = -1;
      if (!follower) emit_next(s, batch_logits.data() + j * V);
    }
  }

  // A sequence whose next token the backend can choose: greedy, without log-probabilities, a
  // constraint or the test-only forced output (those read the logits on the host).
  bool greedy_on_device(const Slot& s) const {
    return opt.forced_output.empty() && !s.req.constraint && s.req.top_logprobs < 0 &&
           s.req.sampling.temperature == 0.0;
  }

  // decode_step on a device backend: the logits stay on the device; greedy sequences get their
  // token from argmax_rows (4 bytes each over the bus), the others their row of logits.
  void decode_step_on_device(int64_t B, int64_t V) {
    const float* dl = model.forward_batch_device(batch_ids.data(), batch_seg.data(), B, batch_states.data(),
                                                 decode_scratch);
    greedy_rows.clear();
    for (int64_t j = 0; j < B; ++j)
      if (greedy_on_device(*batch_slots[size_t(j)])) greedy_rows.push_back(j);
    greedy_ids.resize(greedy_rows.size());
    greedy_bad.resize(greedy_rows.size());
    model.ops().argmax_rows(greedy_ids.data(), greedy_bad.data(), dl, V, V, greedy_rows.data(),
                            int64_t(greedy_rows.size()));
    size_t g = 0;
    for (int64_t j = 0; j < B; ++j) {
      Slot& s = *batch_slots[size_t(j)];
      s.pending = -1;
      const bool greedy = g < greedy_rows.size() && greedy_rows[g] == j;
      if (greedy && !greedy_bad[g]) {
        emit_next(s, nullptr, greedy_ids[g++]);
        continue;
      }
      g += greedy;
      float* row = batch_logits.data() + j * V;  // a non-finite row too: emit_next reports it
      copy_between(nullptr, row, model.device(), dl + j * V, sizeof(float) * size_t(V));
      emit_next(s, row);
    }
  }

  void run() {
    // Named, so per-thread CPU time tells compute (this thread and the OpenMP team it starts,
    // which inherits the name) from the HTTP workers (scripts/serve_load.sh).
    pthread_setname_np(pthread_self(), "k3-engine");
    set_num_threads(threads);  // OpenMP's thread count is per thread: this one computes
    while (true) {
      const Clock::time_point t0 = Clock::now();
      {
        std::unique_lock<std::mutex> lk(mu);
        const auto work = [&] { return stopping || !waiting.empty() || !running.empty(); };
        if (!leading()) {
          cv.wait(lk, work);
        } else {
          // Idle, the leader still shares (an empty or pending log) every heartbeat.
          while (!cv.wait_until(lk, last_share + opt.heartbeat, work)) {
            lk.unlock();
            share();
            lk.lock();
          }
        }
        if (stopping) break;
        if (cancel_running)
          for (auto& s : running) s->handle->cancel();
        admit();
      }
      // Cancelled sequences end before any compute of this step.
      for (auto& s : running)
        if (!s->done && s->handle->cancelled()) finish(*s, "cancelled");
      Clock::time_point t1 = Clock::now();
      double prefill_s = 0, step_s = 0, step_cpu_s = 0;
      try {
        for (auto& s : running)
          if (!s->done && s->prefilling()) {
            prefill_chunk(*s);  // one chunk of one request per iteration: decode steps keep going
            break;
          }
        const Clock::time_point t2 = Clock::now();
        prefill_s = seconds(t2 - t1);
        const double c0 = thread_cpu_seconds();
        decode_step();
        step_cpu_s = thread_cpu_seconds() - c0;
        step_s = seconds(Clock::now() - t2);
      } catch (const std::exception& e) {
        // Replicated, the followers may be inside the failed forward's collectives: the group
        // cannot continue.
        if (channel) channel->abort(std::string("serve: the engine failed in a replicated step: ") + e.what());
        // A failure inside the model ends every sequence of this iteration with the error
        // (the engine keeps serving the next requests).
        for (auto& s : running)
          if (!s->done) finish(*s, "error", e.what());
      }
      const Clock::time_point t3 = Clock::now();
      erase_done();
      std::lock_guard<std::mutex> lk(mu);
      if (step_s > 0) ++stats.steps;
      stats.step_seconds += step_s;
      stats.step_cpu_seconds += step_cpu_s;
      stats.prefill_seconds += prefill_s;
      stats.schedule_seconds += seconds(t3 - t0) - prefill_s - step_s;
      stats.running = int64_t(running.size());
      stats.waiting = int64_t(waiting.size());
      stats.state_bytes = state_bytes();
      stats.snapshot_bytes = cache.bytes();
      stats.snapshots = cache.snapshots();
      if (running.empty() && waiting.empty()) idle_cv.notify_all();
    }
    for (auto& s : running)
      if (!s->done) finish(*s, "cancelled");
    running.clear();
    if (leading()) note().op(Op::Stop), share();
  }

  void erase_done() {
    const auto done = [](const auto& s) { return s->done; };
    if (std::none_of(running.begin(), running.end(), done)) return;
    if (leading()) note().op(Op::Erase);
    running.erase(std::remove_if(running.begin(), running.end(), done), running.end());
  }

  Slot& slot_at(int64_t i) {
    if (i < 0 || i >= int64_t(running.size()))
      fail("engine follower: the leader named slot " + std::to_string(i) + " of " + std::to_string(running.size()));
    return *running[size_t(i)];
  }

  // A follower: applies one message of the leader; true at its Stop.
  bool apply(const std::string& msg) {
    StepReader r{msg};
    while (!r.done()) {
      switch (r.op()) {
        case Op::Admit: {
          GenerationRequest req;
          req.prompt = r.vec<int32_t>();
          req.cache_key = r.vec<int32_t>();
          req.media_id = int32_t(r.i64());
          if (r.i64()) req.media_rows = std::make_shared<const std::vector<float>>(r.vec<float>());
          if (req.prompt.empty()) fail("engine follower: the leader admitted an empty prompt");
          if (!make_room()) fail("engine follower: no room for a slot the leader admitted (the states diverged)");
          open_slot(std::move(req), nullptr, Clock::now());
          break;
        }
        case Op::AdmitBlocked:
          make_room();  // the leader's failed eviction, done the same way
          break;
        case Op::Finish: finish(slot_at(r.i64()), "follower"); break;
        case Op::Token: {
          Slot& s = slot_at(r.i64());
          s.pending = int32_t(r.i64());
          break;
        }
        case Op::Prefill: {
          Slot& s = slot_at(r.i64());
          if (s.done || !s.prefilling()) fail("engine follower: the leader prefills a slot that has no prompt left");
          prefill_chunk(s);
          break;
        }
        case Op::Decode: decode_step(); break;
        case Op::Erase: erase_done(); break;
        case Op::Stop: return true;
        default: fail("engine follower: an unknown operation in a message from the leader");
      }
    }
    return false;
  }
};

void run_engine_follower(const K3Model& model, EngineOptions opt, StepChannel& channel) {
  opt.step_channel = nullptr;
  Engine::Impl im(model, std::move(opt));
  im.channel = &channel;
  im.follower = true;
  std::string msg;
  try {
    do {
      channel.share(msg);
    } while (!im.apply(msg));
  } catch (const std::exception& e) {
    channel.abort(std::string("serve: ") + e.what());
  }
}

Engine::Engine(const K3Model& model, EngineOptions opt) : model_(model), opt_(std::move(opt)) {
  if (opt_.parallel < 1) fail("engine: parallel must be >= 1, got " + std::to_string(opt_.parallel));
  if (opt_.ctx < 2) fail("engine: ctx must be >= 2, got " + std::to_string(opt_.ctx));
  if (opt_.queue_limit < 0) fail("engine: queue limit must be >= 0");
  if (opt_.prefill_chunk < 1) fail("engine: prefill chunk must be >= 1");
  impl_ = std::make_unique<Impl>(model_, opt_);
  if (impl_->slot_bytes > impl_->stats.state_budget_bytes)
    fail("engine: the state budget of " + std::to_string(opt_.state_budget_mb) + " MB is below one sequence's " +
         std::to_string((impl_->slot_bytes + (1 << 20) - 1) >> 20) + " MB at ctx " + std::to_string(opt_.ctx));
  release_idle_threads();  // the engine's thread starts its own OpenMP team (core/threads.h)
  impl_->thread = std::thread([this] { impl_->run(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stopping = true;
    for (Waiting& w : impl_->waiting) {
      GenerationEvent ev;
      ev.final = true;
      ev.finish = "cancelled";
      w.handle->push(std::move(ev));
    }
    impl_->waiting.clear();
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

std::shared_ptr<RequestHandle> Engine::submit(GenerationRequest req) {
  const int64_t V = model_.dims().V, P = int64_t(req.prompt.size());
  if (P == 0) fail("the prompt is empty");
  for (int64_t i = 0; i < P; ++i)
    if (req.prompt[size_t(i)] < 0 || req.prompt[size_t(i)] >= V)
      fail("prompt token " + std::to_string(req.prompt[size_t(i)]) + " at position " + std::to_string(i) +
           " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (req.max_tokens < 1) fail("max_tokens must be >= 1, got " + std::to_string(req.max_tokens));
  if (P + req.max_tokens > opt_.ctx)
    fail("the prompt (" + std::to_string(P) + " tokens) plus max_tokens (" + std::to_string(req.max_tokens) +
         ") exceeds the context of " + std::to_string(opt_.ctx) + " tokens");
  if (req.top_logprobs > 20) fail("top_logprobs must be <= 20");
  if (req.media_rows) {
    const int64_t n = int64_t(std::count(req.prompt.begin(), req.prompt.end(), req.media_id));
    if (int64_t(req.media_rows->size()) != n * model_.dims().d)
      fail("the prompt has " + std::to_string(n) + " image token(s) but the image rows hold " +
           std::to_string(req.media_rows->size()) + " values (hidden size " + std::to_string(model_.dims().d) + ")");
  }
  if (!req.cache_key.empty() && int64_t(req.cache_key.size()) != P)
    fail("the prefix-cache key has " + std::to_string(req.cache_key.size()) + " entries for a prompt of " +
         std::to_string(P));
  for (int32_t t : req.stop_tokens)
    if (t < 0 || t >= V) fail("stop token " + std::to_string(t) + " is outside the vocabulary");
  auto h = std::make_shared<RequestHandle>();
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (impl_->draining || impl_->stopping) fail("the engine is shutting down");
    if (int64_t(impl_->waiting.size()) >= opt_.queue_limit + std::max<int64_t>(0, opt_.parallel - impl_->stats.running))
      throw QueueFull("the request queue is full (" + std::to_string(opt_.queue_limit) + " waiting)");
    impl_->waiting.push_back({h, std::move(req), Clock::now()});
    impl_->stats.waiting = int64_t(impl_->waiting.size());
  }
  impl_->cv.notify_all();
  return h;
}

int64_t Engine::drain(std::chrono::milliseconds deadline) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->draining = true;
  const bool idle = impl_->idle_cv.wait_for(lk, deadline, [&] {
    return impl_->waiting.empty() && impl_->stats.running == 0;
  });
  if (idle) return 0;
  // Past the deadline: cancel what is left; the scheduler ends each within one step.
  int64_t n = int64_t(impl_->waiting.size()) + impl_->stats.running;
  for (Waiting& w : impl_->waiting) w.handle->cancel();
  impl_->cancel_running = true;
  impl_->cv.notify_all();
  impl_->idle_cv.wait_for(lk, std::chrono::seconds(10), [&] {
    return impl_->waiting.empty() && impl_->stats.running == 0;
  });
  return n;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->stats;
}

}  // namespace k3
