// Memory-limited inference (infer/weight_stream.h) on a small MXFP4 model saved to a temp
// directory, with an expert cache far smaller than its experts: logits bitwise equal to the
// resident run (prefill, decode steps, batched decode; O_DIRECT and buffered reads; f32 and
// bf16 trunks), bytes read equal to the analytic count (each call's distinct experts x one
// expert's bytes, for a cache that starts empty and cannot hold them), evictions under
// pressure, a cache that holds everything reading nothing the second time, RssAnon growth
// under the budget, injected read errors and short reads giving an error that names the file
// and the offset (and never wrong numbers afterwards), a checkpoint truncated under the
// running process, and an impossible budget.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/random_model.h"
#include "common/streamed_model.h"
#include "core/error.h"
#include "infer/mem_probe.h"
#include "infer/session.h"
#include "infer/weight_stream.h"
#include "model/checkpoint.h"

using namespace k3;
using k3::test::bitwise_equal;
using k3::test::kBigBudget;
using k3::test::load_opts;

namespace {

constexpr int64_t kF = 256;  // expert width (MXFP4 needs multiples of 32)

// One saved MXFP4 model per dense dtype, shared by the tests.
struct Saved {
  std::unique_ptr<test::TempDir> dir;
  std::string path;
};

const Saved& stream_model(DType dense, int64_t E = 0) {
  static std::map<std::pair<int, int64_t>, Saved> cache;
  Saved& s = cache[{int(dense), E}];
  if (!s.dir) {
    s.dir = std::make_unique<test::TempDir>("k3_stream");
    s.path = s.dir->sub("m");
    K3Config c = test::tiny_config(0, kF);
    if (E > 0) c.num_experts = E;
    const K3Model m = test::random_model(c, 11, ExpertStorage::Mxfp4);
    SaveOptions so;
    so.experts = ExpertStorage::Mxfp4;
    so.dense_dtype = dense;
    save_checkpoint(s.path, m.weights(), so);
  }
  return s;
}

StreamOptions stream_opts(int64_t slots, IoMode io = IoMode::Auto) {
  StreamOptions so;
  so.cache_slots = slots;
  so.io = io;
  so.working_reserve_bytes = uint64_t(4) << 20;
  return so;
}

InferenceModel streamed(const std::string& dir, int64_t slots, IoMode io = IoMode::Auto, bool as_stored = false,
                        StreamOptions so = {}) {
  StreamOptions o = stream_opts(slots, io);
  o.pread_hook = so.pread_hook;
  o.policy = so.policy;
  return load_inference_model(open_model_dir(dir), load_opts(kBigBudget, as_stored), o, 1e9);
}

// Prefill, decode steps, all returned logits concatenated.
std::vector<float> session_logits(const K3Model& m, const std::vector<int32_t>& ids, int64_t prefill) {
  Session s(m);
  const int64_t V = m.dims().V;
  std::vector<float> out;
  const float* l = s.prefill(ids.data(), prefill);
  out.insert(out.end(), l, l + V);
  for (size_t i = size_t(prefill); i < ids.size(); ++i) {
    l = s.step(ids[i]);
    out.insert(out.end(), l, l + V);
  }
  return out;
}

std::vector<float> run_batch(const K3Model& m, const std::vector<int32_t>& prompt_a,
                             const std::vector<int32_t>& prompt_b, int steps) {
  DecodeState a = m.new_state(), b = m.new_state();
  ForwardScratch s;
  const int64_t V = m.dims().V;
  std::vector<float> la(prompt_a.size() * size_t(V)), lb(prompt_b.size() * size_t(V));
  m.forward(la.data(), prompt_a.data(), int64_t(prompt_a.size()), a, s);
  m.forward(lb.data(), prompt_b.data(), int64_t(prompt_b.size()), b, s);
  std::vector<float> out, logits(size_t(2 * V));
  std::vector<int32_t> ids = {3, 7};
  const int64_t seg[3] = {0, 1, 2};
  DecodeState* st[2] = {&a, &b};
  for (int i = 0; i < steps; ++i) {
    m.forward_batch(logits.data(), ids.data(), seg, 2, st, s);
    out.insert(out.end(), logits.begin(), logits.end());
    ids = {int32_t((ids[0] * 5 + 1) % V), int32_t((ids[1] * 3 + 2) % V)};
  }
  return out;
}

// Distinct experts chosen per MoE layer by one full forward over ids (resident model).
int64_t distinct_experts(const K3Model& m, const std::vector<int32_t>& ids) {
  DecodeState st = m.new_state();
  ForwardScratch s;
  ForwardRecord rec;
  std::vector<float> logits(ids.size() * size_t(m.dims().V));
  m.forward(logits.data(), ids.data(), int64_t(ids.size()), st, s, {}, &rec);
  int64_t total = 0;
  for (const LayerRecord& lr : rec.layers) {
    const std::set<int32_t> d(lr.moe.routing.idx.begin(), lr.moe.routing.idx.end());
    total += int64_t(d.size());
  }
  return total;
}

}  // namespace

TEST(WeightStream, LogitsBitwiseEqualResidentAtEveryCacheSize) {
  const std::string dir = stream_model(DType::F32).path;
  const K3Model res = load_model(dir);
  const std::vector<int32_t> ids = test::make_ids(20, res.dims().V, 5);
  const std::vector<float> want = session_logits(res, ids, 12);
  const std::vector<float> want_batch = run_batch(res, {1, 2, 3}, {4, 5}, 3);
  const std::pair<IoMode, int64_t> cases[] = {{IoMode::Direct, 2}, {IoMode::Direct, 5}, {IoMode::Buffered, 3},
                                              {IoMode::Direct, 1000}};
  for (const auto& [io, slots] : cases) {
    InferenceModel im = streamed(dir, slots, io);
    ASSERT_TRUE(im.stream);
    EXPECT_TRUE(bitwise_equal(session_logits(im.model, ids, 12), want)) << "slots " << slots << " " << im.stream->io_mode();
    EXPECT_TRUE(bitwise_equal(run_batch(im.model, {1, 2, 3}, {4, 5}, 3), want_batch)) << "batch, slots " << slots;
    EXPECT_NE(im.stream->io_mode().find(io == IoMode::Direct ? "O_DIRECT" : "buffered"), std::string::npos);
  }
}

TEST(WeightStream, Bf16TrunkIsCopiedAndStillBitwise) {
  const std::string dir = stream_model(DType::BF16).path;
  LoadOptions lo;
  lo.dense_as_stored = true;
  const K3Model res = load_model(dir, lo);
  ASSERT_GT(res.weights().bf16_bytes(), 0);
  const std::vector<int32_t> ids = test::make_ids(10, res.dims().V, 9);
  InferenceModel im = streamed(dir, 3, IoMode::Auto, /*as_stored=*/true);
  EXPECT_EQ(im.model.weights().bf16_bytes(), res.weights().bf16_bytes());
  EXPECT_TRUE(bitwise_equal(session_logits(im.model, ids, 6), session_logits(res, ids, 6)));
}

TEST(WeightStream, BytesReadEqualTheAnalyticCount) {
  const std::string dir = stream_model(DType::F32).path;
  const K3Model res = load_model(dir);
  const std::vector<int32_t> ids = test::make_ids(24, res.dims().V, 3);
  const int64_t D = distinct_experts(res, ids);  // sum over MoE layers of the call's distinct experts
  const int64_t E = res.config().num_experts, L_moe = res.config().num_hidden_layers - res.config().first_k_dense_replace;
  ASSERT_GT(D, 4 * L_moe);  // more than the cache holds in every layer
  for (CachePolicy p : {CachePolicy::LRU, CachePolicy::S3FIFO}) {
    StreamOptions so;
    so.policy = p;
    InferenceModel im = streamed(dir, 4, IoMode::Direct, false, so);
    // One expert as stored: w1, w3 [F, l] and w2 [l, F], MXFP4 nibbles + one scale per 32.
    const int64_t l = res.config().routed_expert_hidden_size, F = res.config().moe_intermediate_size;
    const uint64_t expert_bytes = uint64_t(3 * F * l / 2 + 2 * F * (l / 32) + l * (F / 32));
    ASSERT_EQ(im.stream->expert_bytes(), expert_bytes);
    std::vector<float> logits(ids.size() * size_t(res.dims().V));
    DecodeState st = im.model.new_state();
    ForwardScratch s;
    im.model.forward(logits.data(), ids.data(), int64_t(ids.size()), st, s);  // one chunk of 24 tokens
    const StreamStats a = im.stream->stats();
    EXPECT_EQ(a.calls, L_moe);
    EXPECT_EQ(a.experts_requested, D);
    EXPECT_EQ(a.misses, D);  // an empty cache of 4 slots cannot carry a layer's experts to the next call
    EXPECT_EQ(a.hits, 0);
    EXPECT_EQ(a.payload_bytes, uint64_t(D) * expert_bytes);
    EXPECT_GE(a.device_bytes, a.payload_bytes);
    EXPECT_LE(a.device_bytes, a.payload_bytes + uint64_t(D) * 2 * 4096);  // one aligned run per expert
    EXPECT_EQ(a.evictions, D - 4);  // eviction under pressure: every slot reused
    (void)E;
  }
}

TEST(WeightStream, ACacheThatHoldsEverythingReadsNothingTheSecondTime) {
  const std::string dir = stream_model(DType::F32).path;
  const K3Model res = load_model(dir);
  const std::vector<int32_t> ids = test::make_ids(16, res.dims().V, 4);
  InferenceModel im = streamed(dir, 10000);
  std::vector<float> l1(ids.size() * size_t(res.dims().V)), l2(l1.size());
  ForwardScratch s;
  DecodeState st = im.model.new_state();
  im.model.forward(l1.data(), ids.data(), int64_t(ids.size()), st, s);
  const StreamStats a = im.stream->stats();
  st = im.model.new_state();
  im.model.forward(l2.data(), ids.data(), int64_t(ids.size()), st, s);
  const StreamStats b = im.stream->stats();
  EXPECT_EQ(b.payload_bytes, a.payload_bytes);
  EXPECT_EQ(b.hits - a.hits, a.experts_requested);
  EXPECT_EQ(b.evictions, 0);
  EXPECT_TRUE(bitwise_equal(l1, l2));
}

TEST(WeightStream, RssAnonGrowthStaysUnderTheBudget) {
  // 128 experts per layer (1536 of ~26 KB, ~40 MB) against a budget of the trunk (~11 MB
  // f32) + 4 MB + 3 slots.
  const std::string dir = stream_model(DType::F32, 128).path;
  const ModelDir md = open_model_dir(dir);
  const ProcMem before = read_proc_mem();
  ASSERT_GT(before.rss_anon, 0);
  MemSampler sampler(5);
  StreamOptions so;
  so.working_reserve_bytes = uint64_t(4) << 20;
  // The budget: the trunk (f32) + the reserve + 3 slots; the planner's minimum is 2 slots.
  uint64_t trunk = 0;
  for (const ParamSpec& s : k3_param_specs(md.config))
    if (s.component != Component::RoutedExperts) trunk += uint64_t(s.numel()) * 4;
  const CheckpointReader ck = CheckpointReader::open(dir);
  uint64_t slot = 0, expert = 0;
  ExpertStreamer::measure(ck, md.config, &slot, &expert);
  const uint64_t budget = trunk + so.working_reserve_bytes + 3 * slot;
  const uint64_t all_experts = expert * uint64_t(md.config.num_experts) *
                               uint64_t(md.config.num_hidden_layers - md.config.first_k_dense_replace);
  ASSERT_LT(budget * 2, all_experts + trunk);  // far below what the resident model holds
  InferenceModel im = load_inference_model(md, load_opts(budget, false), so, 1e9);
  EXPECT_EQ(im.stream->slots(), 3);
  EXPECT_LE(im.trunk_bytes + im.stream->arena_bytes(), budget + (uint64_t(2) << 20));  // engine accounting
  const std::vector<int32_t> ids = test::make_ids(12, im.model.dims().V, 8);
  session_logits(im.model, ids, 8);
  sampler.stop();
  const int64_t growth = sampler.peak_anon() - before.rss_anon;
  EXPECT_LT(growth, int64_t(budget)) << "peak RssAnon grew " << growth << " bytes, budget " << budget;
  EXPECT_GE(im.stream->stats().misses, 12);
}

TEST(WeightStream, FailedAndShortReadsNameTheFileAndOffsetAndNeverGiveWrongNumbers) {
  const std::string dir = stream_model(DType::F32).path;
  const K3Model res = load_model(dir);
  const std::vector<int32_t> ids = test::make_ids(10, res.dims().V, 6);
  const std::vector<float> want = session_logits(res, ids, 10);
  struct Fault {
    int mode;  // 1: EIO, 2: a short read then end of file
    const char* text;
  };
  for (Fault f : {Fault{1, "Input/output error"}, Fault{2, "short read"}}) {
    std::atomic<int> calls{0}, armed{1};
    StreamOptions so;
    so.pread_hook = [&](int fd, void* buf, size_t n, off_t off) -> ssize_t {
      if (armed.load() && ++calls == 7) {  // the 7th read fails
        if (f.mode == 1) {
          errno = EIO;
          return -1;
        }
        return 0;
      }
      if (armed.load() && f.mode == 2 && calls.load() > 7) return 0;
      return ::pread(fd, buf, n, off);
    };
    // A cache that holds every expert: a failed read's slot would be hit again on the retry.
    InferenceModel im = streamed(dir, 1000, IoMode::Auto, false, so);
    try {
      session_logits(im.model, ids, 10);
      ADD_FAILURE() << "no error for fault mode " << f.mode;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(f.text), std::string::npos) << msg;
      EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
      EXPECT_NE(msg.find("at offset "), std::string::npos) << msg;
      EXPECT_NE(msg.find("block_sparse_moe.experts."), std::string::npos) << msg;
    }
    // The failed slot was dropped: the same streamer, reads working again, gives the resident logits.
    armed = 0;
    EXPECT_TRUE(bitwise_equal(session_logits(im.model, ids, 10), want)) << "after fault mode " << f.mode;
  }
}

TEST(WeightStream, TruncatedCheckpointUnderARunningProcessIsAClearError) {
  test::TempDir t("k3_trunc");
  const std::string dir = t.sub("m");
  std::filesystem::copy(stream_model(DType::F32).path, dir);
  InferenceModel im = streamed(dir, 3);
  const K3Model& m = im.model;
  const std::vector<int32_t> ids = test::make_ids(8, m.dims().V, 2);
  session_logits(m, ids, 8);  // works
  const std::string file = dir + "/model.safetensors";
  ASSERT_TRUE(std::filesystem::exists(file));
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 3);
  try {
    session_logits(m, ids, 8);
    ADD_FAILURE() << "no error after truncating " << file;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find("short read"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at offset "), std::string::npos) << msg;
  }
}

TEST(WeightStream, ImpossibleBudgetNamesTheOptionAndTheMinimum) {
  const std::string dir = stream_model(DType::F32).path;
  try {
    load_inference_model(open_model_dir(dir), load_opts(1000000, false), {}, 1e9);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--ram-budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("below the minimum"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dense trunk"), std::string::npos) << msg;
  }
}

TEST(WeightStream, PlannerPredictsTheDecodeReadsOfAColdCache) {
  const std::string dir = stream_model(DType::F32).path;
  InferenceModel im = streamed(dir, 2);
  const StreamProjection& p = im.plan;
  // Two slots of 96 experts: hit rate 2/96; a decode token reads top_k experts per MoE layer.
  EXPECT_EQ(p.experts_total, 96);
  EXPECT_EQ(p.cache_slots, 2);
  const double want = double(p.moe_layers * p.top_k) * double(im.stream->expert_bytes()) * (1 - 2.0 / 96);
  EXPECT_NEAR(p.decode_bytes_per_token, want, 1e-6 * want);
  // Measured over decode steps: top_k experts per layer each, almost never cached.
  Session s(im.model);
  const std::vector<int32_t> ids = test::make_ids(9, im.model.dims().V, 1);
  s.prefill(ids.data(), 1);
  im.stream->reset_stats();
  for (int i = 1; i < 9; ++i) s.step(ids[size_t(i)]);
  const StreamStats st = im.stream->stats();
  const double per_token = double(st.payload_bytes) / 8;
  EXPECT_LE(per_token, double(p.moe_layers * p.top_k) * double(im.stream->expert_bytes()));
  EXPECT_GT(per_token, 0.8 * p.decode_bytes_per_token);
}

TEST(WeightStream, SessionsOnTwoThreadsShareTheStreamer) {
  const std::string dir = stream_model(DType::F32).path;
  const K3Model res = load_model(dir);
  const std::vector<int32_t> a = test::make_ids(14, res.dims().V, 21), b = test::make_ids(11, res.dims().V, 22);
  const std::vector<float> want_a = session_logits(res, a, 6), want_b = session_logits(res, b, 4);
  InferenceModel im = streamed(dir, 4);
  std::vector<float> got_a, got_b;
  std::thread t1([&] { got_a = session_logits(im.model, a, 6); });
  std::thread t2([&] { got_b = session_logits(im.model, b, 4); });
  t1.join();
  t2.join();
  EXPECT_TRUE(bitwise_equal(got_a, want_a));
  EXPECT_TRUE(bitwise_equal(got_b, want_b));
}
