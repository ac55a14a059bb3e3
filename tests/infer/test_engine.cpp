// The serving engine (infer/engine.h, infer/prefix_cache.h): requests decoded together give
// the tokens and log-probabilities each gets alone through a Session; the prefix cache changes
// no logits (within 1e-6) over multi-turn conversations that branch and re-join, and counts
// its hits and cached tokens; eviction under a small budget; cancellation frees the slot
// within a step; a full queue is refused; invalid requests name the problem; drain; the
// test-only forced output; a logit constraint is applied.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/emulated_backend.h"
#include "common/random_model.h"
#include "core/error.h"
#include "infer/engine.h"
#include "infer/session.h"

using namespace k3;
using namespace std::chrono_literals;

namespace {

struct Result {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  GenerationEvent final;
};

Result collect(RequestHandle& h) {
  Result r;
  GenerationEvent ev;
  while (true) {
    if (!h.next(ev, 60s)) {
      ADD_FAILURE() << "no event within 60 s";
      return r;
    }
    if (ev.final) {
      r.final = ev;
      return r;
    }
    r.ids.push_back(ev.id);
    r.logprobs.push_back(ev.logprob);
    r.top.push_back(ev.top);
  }
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n, int top = 5) {
  GenerationRequest q;
  q.prompt = std::move(prompt);
  q.max_tokens = n;
  q.top_logprobs = top;
  return q;
}

// Greedy tokens of a Session (prefill, then decode steps): the single-sequence reference.
std::vector<int32_t> session_greedy(const K3Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  Session s(m);
  const int64_t V = m.dims().V;
  const float* l = s.prefill(prompt);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(std::max_element(l, l + V) - l);
    out.push_back(id);
    if (i + 1 < n) l = s.step(id);
  }
  return out;
}

const K3Model& model() {
  static const K3Model m = test::random_model(test::tiny_config(), 51);
  return m;
}

TEST(Engine, ConcurrentRequestsGiveTheirOwnGreedyTokens) {
  const K3Model& m = model();
  EngineOptions o;
  o.parallel = 3;
  o.ctx = 512;
  o.prefill_chunk = 64;
  Engine e(m, o);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(test::make_ids(10 + 37 * i, m.dims().V, uint32_t(300 + i)));
    hs.push_back(e.submit(greedy(prompts.back(), 12)));
  }
  for (int i = 0; i < 5; ++i) {
    const Result r = collect(*hs[size_t(i)]);
    EXPECT_EQ(r.final.finish, "length");
    EXPECT_EQ(r.final.completion_tokens, 12);
    EXPECT_EQ(r.final.prompt_tokens, int64_t(prompts[size_t(i)].size()));
    EXPECT_EQ(r.ids, session_greedy(m, prompts[size_t(i)], 12)) << "request " << i;
    for (size_t t = 0; t < r.ids.size(); ++t) {
      ASSERT_EQ(r.top[t].size(), 5u);
      EXPECT_EQ(r.top[t][0].id, r.ids[t]);  // greedy: the chosen token is the best
      EXPECT_FLOAT_EQ(r.top[t][0].logprob, r.logprobs[t]);
      EXPECT_LE(r.logprobs[t], 0.f);
    }
  }
  const EngineStats st = e.stats();
  EXPECT_EQ(st.requests_total, 5u);
  EXPECT_EQ(st.generation_tokens_total, 60u);
  EXPECT_EQ(st.ttft.total, 5u);
  EXPECT_EQ(st.itl.total, 55u);
  EXPECT_GT(st.steps, 0u);
}

// A conversation tree: turns that extend earlier prompts, a branch, and a re-join of a shared
// prefix. Every generated token's top-20 log-probabilities with the cache equal those without.
TEST(Engine, PrefixCacheChangesNoLogits) {
  const K3Model& m = model();
  const int64_t V = m.dims().V;
  const std::vector<int32_t> system = test::make_ids(150, V, 7);
  auto cat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<int32_t> turn1 = cat(system, test::make_ids(40, V, 8));
  const std::vector<int32_t> turn2 = cat(turn1, test::make_ids(90, V, 9));
  const std::vector<int32_t> branch = cat(turn1, test::make_ids(70, V, 10));
  const std::vector<int32_t> rejoin = cat(system, test::make_ids(20, V, 11));
  const std::vector<std::vector<int32_t>> prompts = {turn1, turn2, branch, rejoin, turn2};
  std::vector<Result> with, without;
  for (bool cached : {true, false}) {
    EngineOptions o;
    o.parallel = 1;
    o.ctx = 512;
    o.prefill_chunk = 32;
    o.prefix_cache = cached;
    Engine e(m, o);
    for (const auto& p : prompts) (cached ? with : without).push_back(collect(*e.submit(greedy(p, 6, 20))));
    const EngineStats st = e.stats();
    if (cached) {
      EXPECT_EQ(st.prefix_cache_misses, 1u);  // only the first request finds nothing
      EXPECT_EQ(st.prefix_cache_hits, 4u);
      EXPECT_GT(st.snapshot_bytes, 0);
    } else {
      EXPECT_EQ(st.prefix_cache_hits + st.prefix_cache_misses, 0u);
      EXPECT_EQ(st.cached_prompt_tokens_total, 0u);
    }
  }
  // Cached tokens: the deepest 32-token boundary below each prompt's end shared with earlier prompts.
  EXPECT_EQ(with[0].final.cached_tokens, 0);
  EXPECT_EQ(with[1].final.cached_tokens, 160);  // turn1 = 190 tokens: boundaries to 160
  EXPECT_EQ(with[2].final.cached_tokens, 160);
  EXPECT_EQ(with[3].final.cached_tokens, 128);  // the system prompt's 150 tokens: to 128
  EXPECT_EQ(with[4].final.cached_tokens, 256);  // turn2 again: its own snapshots to 256 (of 280)
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(with[i].ids, without[i].ids) << "prompt " << i;
    for (size_t t = 0; t < with[i].ids.size(); ++t)
      for (size_t k = 0; k < 20; ++k) {
        EXPECT_EQ(with[i].top[t][k].id, without[i].top[t][k].id);
        EXPECT_NEAR(with[i].top[t][k].logprob, without[i].top[t][k].logprob, 1e-6) << "prompt " << i << " token " << t;
      }
  }
}

TEST(Engine, PrefixCacheEvictsUnderItsBudgetAndStaysExact) {
  const K3Model& m = model();
  EngineOptions o;
  o.parallel = 1;
  o.ctx = 256;
  o.prefill_chunk = 16;
  o.state_budget_mb = 1;
  std::vector<Result> got;
  std::vector<std::vector<int32_t>> prompts;
  Engine e(m, o);
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(test::make_ids(200, m.dims().V, uint32_t(400 + i)));
    got.push_back(collect(*e.submit(greedy(prompts.back(), 4))));
  }
  const EngineStats st = e.stats();
  EXPECT_LE(st.state_bytes, st.state_budget_bytes);
  EXPECT_GT(st.snapshots, 0);
  EXPECT_LT(st.snapshots, 6 * 12);  // 12 boundaries per prompt: older ones were evicted
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[size_t(i)].ids, session_greedy(m, prompts[size_t(i)], 4));
  // Repeating the last prompt restores its snapshots if they survived, else recomputes: same tokens.
  EXPECT_EQ(collect(*e.submit(greedy(prompts.back(), 4))).ids, got.back().ids);
}

TEST(Engine, CancelEndsWithinAStepAndFreesTheSlot) {
  const K3Model& m = model();
  EngineOptions o;
  o.parallel = 1;
  o.ctx = 4096;
  Engine e(m, o);
  auto h = e.submit(greedy(test::make_ids(20, m.dims().V, 1), 4000, -1));
  GenerationEvent ev;
  ASSERT_TRUE(h->next(ev, 60s));  // generation has started
  h->cancel();
  int64_t after = 0;
  while (h->next(ev, 60s) && !ev.final) ++after;
  EXPECT_TRUE(ev.final);
  EXPECT_EQ(ev.finish, "cancelled");
  EXPECT_LT(after, 4);  // at most the tokens already in flight
  // The slot is free: the next request runs to completion.
  EXPECT_EQ(collect(*e.submit(greedy(test::make_ids(5, m.dims().V, 2), 3))).final.finish, "length");
}

TEST(Engine, FullQueueIsRefused) {
  const K3Model& m = model();
  EngineOptions o;
  o.parallel = 1;
  o.queue_limit = 2;
  o.ctx = 4096;
  Engine e(m, o);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  bool refused = false;
  for (int i = 0; i < 8 && !refused; ++i) {
    try {
      hs.push_back(e.submit(greedy(test::make_ids(8, m.dims().V, 3), 3000, -1)));
    } catch (const QueueFull&) {
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
  EXPECT_LE(hs.size(), 3u + 1u);  // one running (maybe still counted as waiting), two waiting
  for (auto& h : hs) h->cancel();
}

TEST(Engine, InvalidRequestsNameTheProblem) {
  const K3Model& m = model();
  EngineOptions o;
  o.ctx = 64;
  Engine e(m, o);
  auto expect_error = [&](GenerationRequest q, const std::string& what) {
    try {
      e.submit(std::move(q));
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  };
  expect_error(greedy({}, 3), "empty");
  expect_error(greedy({1, int32_t(m.dims().V)}, 3), "position 1");
  expect_error(greedy({1, 2}, 0), "max_tokens");
  expect_error(greedy(test::make_ids(60, m.dims().V, 4), 10), "exceeds the context");
  EXPECT_THROW(Engine(m, [] {
                 EngineOptions b;
                 b.ctx = 1 << 20;
                 b.state_budget_mb = 1;
                 return b;
               }()),
               Error);
}

TEST(Engine, DrainFinishesInFlightThenRefuses) {
  const K3Model& m = model();
  EngineOptions o;
  o.parallel = 2;
  Engine e(m, o);
  auto a = e.submit(greedy(test::make_ids(9, m.dims().V, 5), 5));
  auto b = e.submit(greedy(test::make_ids(9, m.dims().V, 6), 4000, -1));
  EXPECT_EQ(e.drain(300ms), 1);  // b cannot finish in time
  EXPECT_EQ(collect(*a).final.finish, "length");
  EXPECT_EQ(collect(*b).final.finish, "cancelled");
  EXPECT_THROW(e.submit(greedy({1, 2}, 2)), Error);
}

TEST(Engine, ForcedOutputThenTheStopToken) {
  const K3Model& m = model();
  EngineOptions o;
  o.forced_output = {7, 8, 9};
  Engine e(m, o);
  GenerationRequest q = greedy({1, 2, 3}, 10, -1);
  q.stop_tokens = {42};
  const Result r = collect(*e.submit(q));
  EXPECT_EQ(r.ids, (std::vector<int32_t>{7, 8, 9, 42}));
  EXPECT_EQ(r.final.finish, "stop");
  const Result no_stop = collect(*e.submit(greedy({1, 2, 3}, 10, -1)));
  EXPECT_EQ(no_stop.ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(no_stop.final.finish, "length");
}

struct EvenIdsOnly : LogitConstraint {
  int accepted = 0;
  void mask(float* logits, int64_t vocab) override {
    for (int64_t i = 1; i < vocab; i += 2) logits[i] = -INFINITY;
  }
  void accept(int32_t id) override {
    EXPECT_EQ(id % 2, 0);
    ++accepted;
  }
};

TEST(Engine, ConstraintMasksEverySampledToken) {
  const K3Model& m = model();
  Engine e(m, {});
  GenerationRequest q = greedy(test::make_ids(12, m.dims().V, 12), 20, -1);
  q.sampling.temperature = 1.0;
  q.sampling.seed = 3;
  auto c = std::make_shared<EvenIdsOnly>();
  q.constraint = c;
  const Result r = collect(*e.submit(q));
  ASSERT_EQ(r.ids.size(), 20u);
  for (int32_t id : r.ids) EXPECT_EQ(id % 2, 0);
  EXPECT_EQ(c->accepted, 20);
}

}  // namespace

struct RejectsSeven : LogitConstraint {
  void mask(float*, int64_t) override {}
  void accept(int32_t id) override {
    if (id == 7) fail("token 7 is not allowed here");
  }
};

// A constraint that refuses a (forced) token ends that request with an error; the engine
// keeps serving.
TEST(Engine, ConstraintErrorEndsOnlyItsRequest) {
  const K3Model& m = model();
  EngineOptions o;
  o.forced_output = {5, 7, 9};
  Engine e(m, o);
  GenerationRequest q = greedy({1, 2, 3}, 10, -1);
  q.constraint = std::make_shared<RejectsSeven>();
  const Result bad = collect(*e.submit(q));
  EXPECT_EQ(bad.final.finish, "error");
  EXPECT_NE(bad.final.error.find("token 7"), std::string::npos) << bad.final.error;
  EXPECT_EQ(bad.ids, (std::vector<int32_t>{5}));
  EXPECT_EQ(collect(*e.submit(greedy({1, 2, 3}, 10, -1))).ids, (std::vector<int32_t>{5, 7, 9}));
}

// The engine on a device backend (the emulated one: device pointers the host cannot
// dereference, CPU kernels behind them): every request gets the tokens and log-probabilities
// the CPU engine gives it, with the prefix cache's snapshots taken from and restored to device
// states, and the greedy tokens of a Session on the device equal the CPU's.
TEST(Engine, DeviceBackendGivesTheCpuTokensWithThePrefixCache) {
  const K3Model& cpu = model();
  K3Model dev = test::random_model(test::tiny_config(), 51);
  dev.to_backend(test::emulated_ops());
  const int64_t V = cpu.dims().V;
  const std::vector<int32_t> system = test::make_ids(40, V, 17);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = system;
    const std::vector<int32_t> tail = test::make_ids(5 + 9 * i, V, uint32_t(40 + i));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  std::vector<std::vector<Result>> res(2);
  for (int b = 0; b < 2; ++b) {
    EngineOptions o;
    o.parallel = 2;
    o.ctx = 512;
    o.prefill_chunk = 16;
    o.prefix_cache = true;
    Engine e(b == 0 ? cpu : dev, o);
    std::vector<std::shared_ptr<RequestHandle>> hs;
    // Half the requests without log-probabilities: their tokens are chosen on the backend
    // (argmax_rows), the others' rows of logits are read out.
    for (size_t i = 0; i < prompts.size(); ++i) hs.push_back(e.submit(greedy(prompts[i], 5, i % 2 ? 5 : -1)));
    for (auto& h : hs) res[size_t(b)].push_back(collect(*h));
    EXPECT_GT(e.stats().prefix_cache_hits, 0u);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(res[0][i].ids.size(), 5u) << "request " << i;
    EXPECT_EQ(res[0][i].ids, res[1][i].ids) << "request " << i;
    EXPECT_EQ(res[0][i].logprobs, res[1][i].logprobs) << "request " << i;
  }
  EXPECT_EQ(session_greedy(dev, prompts[0], 6), session_greedy(cpu, prompts[0], 6));
}
