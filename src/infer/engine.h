// The serving engine: continuous batching of many sequences over one K3Model.
//
// One scheduler thread owns the model's compute. Each iteration it (1) admits waiting requests
// into free slots while the state-memory budget allows, restoring each from the longest
// prefix-cache snapshot of its prompt; (2) runs one prefill chunk of one admitted request
// (chunks aligned to absolute positions, so a snapshot at a chunk boundary is exactly the state
// an uncached run reaches there); (3) runs one decode step of every running sequence as one
// batch (K3Model::forward_batch: every weight and every routed expert is read once per step
// for the whole batch). Callers talk to it through a RequestHandle: a blocking queue of events
// plus cancel(). Nothing here knows HTTP or the chat format (src/serve does).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "infer/sampler.h"
#include "model/k3_model.h"

namespace k3 {

// Constrained decoding: masks the logits before sampling and is told the sampled token.
// Implementations: infer/json_constraint.h. Called on the scheduler thread only.
class LogitConstraint {
 public:
  virtual ~LogitConstraint() = default;
  virtual void mask(float* logits, int64_t vocab) = 0;  // disallowed ids -> -inf
  virtual void accept(int32_t id) = 0;
};

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;       // token ids, at least one
  int64_t max_tokens = 256;          // generated tokens at most (finish "length")
  SamplerOptions sampling;
  std::vector<int32_t> stop_tokens;  // sampling one ends the sequence (finish "stop"); it is emitted
  int top_logprobs = -1;             // -1: no logprobs; 0..20: the chosen token's + the n best
  std::shared_ptr<LogitConstraint> constraint;  // optional
  // Images (infer/image_prompt.h): the encoder's rows [n, hidden] for the prompt's media_id
  // positions in order (n = their count), shared by a request's choices, and the prefix-cache
  // key (the prompt with image tokens replaced by hashes of their images; same length), so
  // two different images behind the same text never share a cached state.
  int32_t media_id = -1;
  std::shared_ptr<const std::vector<float>> media_rows;
  std::vector<int32_t> cache_key;
};

// One event of a request's stream. Token events carry id (and logprobs when asked); the last
// event has final = true, finish set and the usage figures.
struct GenerationEvent {
  int32_t id = -1;
  float logprob = 0;
  std::vector<TokenLogprob> top;  // the n best, best first
  bool final = false;
  std::string finish;    // "stop", "length", "cancelled", "error"
  std::string error;     // finish == "error": what went wrong
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double ttft_s = 0;     // submit to first generated token
};

class Engine;

// The caller's end of one request: events in order, then a final one. Thread-safe.
class RequestHandle {
 public:
  // Waits up to `timeout` for the next event; false on timeout (ev untouched).
  bool next(GenerationEvent& ev, std::chrono::milliseconds timeout);
  // Stops generation within one scheduler step and frees the slot; a final "cancelled" event follows.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Engine;
  void push(GenerationEvent ev);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
  std::atomic<bool> cancelled_{false};
};

// Fixed-bucket latency histogram (seconds), Prometheus-style cumulative on export.
struct LatencyHistogram {
  static const std::vector<double>& bounds();  // upper bounds, ascending; +Inf implied
  std::vector<uint64_t> counts;                // per bucket (bounds().size() + 1), not cumulative
  double sum = 0;
  uint64_t total = 0;
  void observe(double seconds);
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  uint64_t requests_total = 0, prompt_tokens_total = 0, generation_tokens_total = 0;
  uint64_t prefix_cache_hits = 0, prefix_cache_misses = 0;  // per admitted request
  uint64_t cached_prompt_tokens_total = 0;
  int64_t state_bytes = 0;         // slots in use + prefix-cache snapshots
  int64_t state_budget_bytes = 0;
  int64_t snapshot_bytes = 0;      // prefix cache alone
  int64_t snapshots = 0;           // prefix-cache snapshots held
  uint64_t steps = 0;              // decode batches run
  double step_seconds = 0, prefill_seconds = 0, schedule_seconds = 0;  // where the (wall) time went
  double step_cpu_seconds = 0;     // the scheduler thread's own CPU time in decode steps
  LatencyHistogram ttft, itl;      // time to first token; inter-token latency
};

// Replication of the engine's state on other processes (expert-parallel serving, src/dist/
// step_channel.h): the leader (the engine that takes requests) hands every decision that changes
// its state (a request admitted, a token sampled, a sequence ended) to the channel before each
// model forward, so the followers (run_engine_follower) hold the same slots, states and prefix
// cache and run the same forwards with it; the routed experts' collectives happen inside those
// forwards. Called on the scheduler thread only.
class StepChannel {
 public:
  virtual ~StepChannel() = default;
  // Leader: sends `bytes` to every follower. Follower: replaces `bytes` with the leader's next
  // message. Collective over the leader and its followers.
  virtual void share(std::string& bytes) = 0;
  // Ends every process of the group after printing msg (the group cannot stay consistent).
  [[noreturn]] virtual void abort(const std::string& msg) = 0;
};

struct EngineOptions {
  int64_t parallel = 8;               // slots: sequences decoded together at most
  int64_t ctx = 4096;                 // prompt + generated tokens per sequence at most
  int64_t queue_limit = 64;           // waiting requests beyond this: submit throws QueueFull
  int64_t state_budget_mb = 2048;     // slots + snapshots
  int64_t prefill_chunk = 256;        // tokens per prefill chunk (snapshot granularity)
  bool prefix_cache = true;
  // Test-only (never set from a request): replaces sampling by these tokens, in order, for
  // every request (after them: the request's first stop token, or "length").
  std::vector<int32_t> forced_output;
  // Leader of a replicated engine (see StepChannel): null for a lone engine. While idle the
  // leader shares an empty message every heartbeat, so a follower can tell a quiet leader from
  // a lost one (its channel's timeout).
  StepChannel* step_channel = nullptr;
  std::chrono::milliseconds heartbeat{1000};
};

// submit() beyond queue_limit (HTTP 429).
struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  Engine(const K3Model& model, EngineOptions opt);
  ~Engine();  // cancels everything in flight and joins the scheduler
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. k3::Error for an invalid one (empty prompt, ids outside the vocabulary,
  // prompt + max_tokens beyond ctx); QueueFull when the queue is full; an Error once draining.
  std::shared_ptr<RequestHandle> submit(GenerationRequest req);
  // Stops admitting; waits until in-flight requests finish or `deadline` passes, then
  // cancels the rest. Returns the number cancelled.
  int64_t drain(std::chrono::milliseconds deadline);
  EngineStats stats() const;
  const K3Model& model() const { return model_; }
  const EngineOptions& options() const { return opt_; }

 private:
  struct Impl;
  friend void run_engine_follower(const K3Model& model, EngineOptions opt, StepChannel& channel);
  const K3Model& model_;
  EngineOptions opt_;
  std::unique_ptr<Impl> impl_;
};

// A follower of a replicated engine: on the calling thread, applies the leader's messages from
// `channel` to an engine state of its own over `model` (opt as the leader's, step_channel
// ignored) and runs the same forwards, until the leader stops (returns) or the group fails
// (channel.abort). Samples nothing: the leader's tokens come with its messages.
void run_engine_follower(const K3Model& model, EngineOptions opt, StepChannel& channel);

}  // namespace k3
