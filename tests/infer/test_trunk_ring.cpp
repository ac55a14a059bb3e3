// The dense trunk streamed through a ring (infer/trunk_ring.h) on a small MXFP4 model saved to
// a temp directory (5 layers, so a ring of 1 or 2 slots re-reads every layer each call), with
// the expert streamer on as well: logits bitwise equal to the resident run for prefill, decode
// steps, chunked prefill and batched decode (f32 and bf16 trunks, O_DIRECT and buffered), the
// trunk bytes read equal to the analytic count (every layer once per call), RssAnon growth
// under a budget below the trunk, an injected failed / short trunk read giving an error naming
// the file, the offset and the tensor with the next call correct (a transient fault on a read
// ahead retried), two threads sharing the
// ring (and the streamed head), a pinned prefix of layers, and a budget below the ring's
// minimum naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
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
using k3::test::run_batch;
using k3::test::run_session;
using k3::test::saved_model;

namespace {

StreamOptions ring_opts(int64_t trunk_slots, IoMode io = IoMode::Auto) {
  StreamOptions so;
  so.cache_slots = 3;
  so.io = io;
  so.working_reserve_bytes = uint64_t(4) << 20;
  so.stream_trunk = true;
  so.trunk_slots = trunk_slots;
  return so;
}

InferenceModel ringed(const std::string& dir, const StreamOptions& so, bool as_stored = false) {
  return load_inference_model(open_model_dir(dir), load_opts(kBigBudget, as_stored), so, 1e9);
}

// The trunk matrices one pass reads, from the parameter table: numel x the stored dtype's size.
uint64_t analytic_pass_payload(const K3Config& c, uint64_t elem_bytes) {
  uint64_t n = 0;
  for (const ParamSpec& s : k3_param_specs(c))
    if (is_streamable_layer_matrix(s)) n += uint64_t(s.numel()) * elem_bytes;
  return n;
}

}  // namespace

TEST(TrunkRing, LogitsBitwiseEqualResident) {
  struct Case {
    DType dense;
    bool as_stored;
    int64_t slots;
    IoMode io;
  };
  std::map<std::pair<int, bool>, std::vector<std::vector<float>>> want;  // resident runs, once per model
  for (const Case& k : {Case{DType::F32, false, 2, IoMode::Direct}, Case{DType::F32, false, 1, IoMode::Buffered},
                        Case{DType::BF16, true, 2, IoMode::Auto}, Case{DType::BF16, false, 3, IoMode::Direct}}) {
    const std::string dir = saved_model(k.dense).path;
    std::vector<std::vector<float>>& w = want[{int(k.dense), k.as_stored}];
    const std::vector<int32_t> ids = test::make_ids(12, 256, 5);
    if (w.empty()) {
      LoadOptions lo;
      lo.dense_as_stored = k.as_stored;
      const K3Model res = load_model(dir, lo);
      w = {run_session(res, ids, 8), run_session(res, ids, 8, 3), run_batch(res, 2)};
    }
    InferenceModel im = ringed(dir, ring_opts(k.slots, k.io), k.as_stored);
    ASSERT_TRUE(im.trunk);
    ASSERT_TRUE(im.stream);
    EXPECT_EQ(im.trunk->slots(), k.slots);
    EXPECT_EQ(im.model.weights().bf16_bytes() > 0, k.as_stored);
    const std::string what = std::string(dtype_name(k.dense)) + " as_stored " + std::to_string(k.as_stored) +
                             " slots " + std::to_string(k.slots) + " " + im.trunk->io_mode();
    EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 8), w[0])) << what;
    EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 8, 3), w[1])) << "chunked, " << what;
    EXPECT_TRUE(bitwise_equal(run_batch(im.model, 2), w[2])) << "batch, " << what;
    EXPECT_NE(im.trunk->io_mode().find(k.io == IoMode::Buffered ? "buffered" : "O_DIRECT"), std::string::npos);
    EXPECT_NE(im.trunk_note.find("dense trunk streamed"), std::string::npos) << im.trunk_note;
  }
}

TEST(TrunkRing, ReadsEveryLayerOncePerCall) {
  for (auto [dense, elem] : {std::pair{DType::F32, 4}, std::pair{DType::BF16, 2}}) {
    const std::string dir = saved_model(dense).path;
    InferenceModel im = ringed(dir, ring_opts(2), dense == DType::BF16);
    const K3Config& c = im.model.config();
    const int64_t L = c.num_hidden_layers;
    const uint64_t pass = analytic_pass_payload(c, uint64_t(elem));
    uint64_t sum = 0, dev = 0;
    for (int64_t l = 0; l < L; ++l) sum += im.trunk->layer_payload_bytes(l), dev += im.trunk->layer_device_bytes(l);
    ASSERT_EQ(sum, pass);
    EXPECT_EQ(im.plan.ring.pass_payload, pass);
    EXPECT_EQ(im.plan.trunk_bytes_per_call, double(dev));
    // K calls (a prefill, decode steps, a batched step): every layer once per call, plus the
    // first layer read at load and at the end of each call for the next one.
    const std::vector<int32_t> ids = test::make_ids(9, im.model.dims().V, 3);
    run_session(im.model, ids, 5);  // 1 + 4 calls
    im.trunk->wait_idle();
    const int64_t K = 5;
    const TrunkStats st = im.trunk->stats();
    EXPECT_EQ(st.acquires, K * L);
    EXPECT_EQ(st.layer_reads, K * L + 1);
    EXPECT_EQ(st.payload_bytes, uint64_t(K) * pass + im.trunk->layer_payload_bytes(0));
    EXPECT_EQ(st.device_bytes, uint64_t(K) * dev + im.trunk->layer_device_bytes(0));
    EXPECT_GE(dev, pass);
    EXPECT_LE(dev, pass + uint64_t(L) * 64 * 4096);  // widening and small gaps only
  }
}

TEST(TrunkRing, ALayerCountThatFitsTheRingIsReadOnce) {
  const std::string dir = saved_model(DType::F32).path;
  InferenceModel im = ringed(dir, ring_opts(5));  // as many slots as layers: kept after release
  const std::vector<int32_t> ids = test::make_ids(6, im.model.dims().V, 2);
  run_session(im.model, ids, 3);
  im.trunk->wait_idle();
  EXPECT_EQ(im.trunk->stats().layer_reads, 5);
  // 4 calls; only the first call's layers can have waited for their reads.
  EXPECT_EQ(im.trunk->stats().acquires, 4 * 5);
  EXPECT_GE(im.trunk->stats().hits, 3 * 5);
}

TEST(TrunkRing, RssAnonGrowthStaysUnderABudgetBelowTheTrunk) {
  const std::string dir = saved_model(DType::F32, 0, /*full=*/true).path;  // 13 layers: the trunk >> 2 of them
  const ModelDir md = open_model_dir(dir);
  const CheckpointReader ck = CheckpointReader::open(dir);
  uint64_t trunk = 0;
  for (const ParamSpec& s : k3_param_specs(md.config))
    if (s.component != Component::RoutedExperts) trunk += uint64_t(s.numel()) * 4;
  uint64_t slot = 0, expert = 0;
  ExpertStreamer::measure(ck, md.config, &slot, &expert);
  const TrunkRingPlan ring = TrunkRing::measure(ck, md.config, false, 2);
  StreamOptions so;
  so.working_reserve_bytes = uint64_t(4) << 20;
  const uint64_t budget = ring.held_bytes() + so.working_reserve_bytes + 3 * slot;
  ASSERT_LT(budget, trunk);  // the resident trunk alone would not fit: this budget was refused before
  const ProcMem before = read_proc_mem();
  MemSampler sampler(5);
  InferenceModel im = load_inference_model(md, load_opts(budget, false), so, 1e9);
  ASSERT_TRUE(im.trunk);
  EXPECT_EQ(im.trunk->slots(), 2);
  EXPECT_EQ(im.stream->slots(), 3);
  EXPECT_LE(im.trunk_bytes + im.trunk->arena_bytes() + im.stream->arena_bytes(), budget + (uint64_t(4) << 20));
  const std::vector<int32_t> ids = test::make_ids(8, im.model.dims().V, 8);
  run_session(im.model, ids, 6);
  sampler.stop();
  const int64_t growth = sampler.peak_anon() - before.rss_anon;
  EXPECT_LT(growth, int64_t(budget)) << "peak RssAnon grew " << growth << " bytes, budget " << budget;
  EXPECT_NE(im.plan.ring.slots, 0);
  EXPECT_NE(stream_projection_line(im.plan).find("trunk streamed through a ring of 2 slots"), std::string::npos)
      << stream_projection_line(im.plan);
}

TEST(TrunkRing, FailedAndShortReadsNameTheFileOffsetAndTensorThenTheNextCallWorks) {
  const std::string dir = saved_model(DType::F32).path;
  const K3Model res = load_model(dir);
  const std::vector<int32_t> ids = test::make_ids(6, res.dims().V, 6);
  const std::vector<float> want = run_session(res, ids, 4);
  const CheckpointReader ck = CheckpointReader::open(dir);
  const TensorInfo& ti = ck.info(layer_prefix(3) + "block_sparse_moe.shared_experts.down_proj.weight");
  const uint64_t T = ti.offset + 64;  // a byte inside that matrix
  for (int mode : {1, 2}) {  // 1: EIO on every read covering T; 2: the read stops short of T
    std::atomic<int> armed{1};
    StreamOptions so = ring_opts(2);
    so.trunk_pread_hook = [&, mode](int fd, void* buf, size_t n, off_t off) -> ssize_t {
      const uint64_t o = uint64_t(off);
      if (armed.load() && o <= T && T < o + n) {
        if (mode == 1) {
          errno = EIO;
          return -1;
        }
        const size_t part = (T - o) / 4096 * 4096;
        return part ? ::pread(fd, buf, part, off) : 0;
      }
      return ::pread(fd, buf, n, off);
    };
    InferenceModel im = ringed(dir, so);
    try {
      run_session(im.model, ids, 4);
      ADD_FAILURE() << "no error for fault mode " << mode;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(mode == 1 ? "Input/output error" : "short read"), std::string::npos) << msg;
      EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
      EXPECT_NE(msg.find("at offset "), std::string::npos) << msg;
      EXPECT_NE(msg.find("the trunk of layer 3"), std::string::npos) << msg;
      EXPECT_NE(msg.find("layers.3."), std::string::npos) << msg;
    }
    armed = 0;
    EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 4), want)) << "after fault mode " << mode;
  }
  // One transient EIO on the read ahead of layer 3 (started while layer 2 computes): the
  // acquire reads it again, and the run gives the resident logits.
  std::atomic<int> faults{0};
  StreamOptions so = ring_opts(2);
  so.trunk_pread_hook = [&](int fd, void* buf, size_t n, off_t off) -> ssize_t {
    if (uint64_t(off) <= T && T < uint64_t(off) + n && faults++ == 0) {
      errno = EIO;
      return -1;
    }
    return ::pread(fd, buf, n, off);
  };
  InferenceModel im = ringed(dir, so);
  EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 4), want));
  EXPECT_GE(faults.load(), 2);  // the failed read and its retry
}

TEST(TrunkRing, SessionsOnTwoThreadsShareTheRing) {
  const std::string dir = saved_model(DType::BF16).path;
  LoadOptions lo;
  lo.dense_as_stored = true;
  const K3Model res = load_model(dir, lo);
  const std::vector<int32_t> a = test::make_ids(7, res.dims().V, 21), b = test::make_ids(6, res.dims().V, 22);
  const std::vector<float> want_a = run_session(res, a, 4), want_b = run_session(res, b, 3);
  for (bool head : {false, true}) {  // with the embedding and lm_head streamed too (4 blocks of 64 rows)
    StreamOptions so = ring_opts(2);
    so.stream_head = head;
    so.head_block_rows = head ? 64 : 0;
    InferenceModel im = ringed(dir, so, true);
    ASSERT_EQ(bool(im.head), head);
    std::vector<float> got_a, got_b;
    std::thread t1([&] { got_a = run_session(im.model, a, 4); });
    std::thread t2([&] { got_b = run_session(im.model, b, 3); });
    t1.join();
    t2.join();
    // One row per call (last-position prefill, decode steps): the blocked lm_head product
    // equals the unblocked one (kernels/gemv.h), so the plain resident run is the reference.
    EXPECT_TRUE(bitwise_equal(got_a, want_a)) << "head streamed " << head;
    EXPECT_TRUE(bitwise_equal(got_b, want_b)) << "head streamed " << head;
  }
}

TEST(TrunkRing, ABudgetBelowTheRingNamesTheNewMinimum) {
  const std::string dir = saved_model(DType::F32).path;
  try {
    StreamOptions so;
    so.working_reserve_bytes = uint64_t(4) << 20;
    load_inference_model(open_model_dir(dir), load_opts(1000000, false), so, 1e9);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--ram-budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("below the minimum"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ring of 1 slot"), std::string::npos) << msg;
    EXPECT_NE(msg.find("two slots"), std::string::npos) << msg;
  }
}

TEST(TrunkRing, APinnedPrefixIsHeldAndNeverReadAndTheLogitsStayBitwise) {
  for (auto [dense, as_stored] : {std::pair{DType::F32, false}, std::pair{DType::BF16, true}}) {
    const std::string dir = saved_model(dense).path;
    LoadOptions lo;
    lo.dense_as_stored = as_stored;
    const K3Model res = load_model(dir, lo);
    const std::vector<int32_t> ids = test::make_ids(12, 256, 5);
    StreamOptions so = ring_opts(2);
    so.trunk_pinned = 2;  // layers 0 (the dense one) and 1 held, 2-4 streamed
    InferenceModel im = ringed(dir, so, as_stored);
    ASSERT_TRUE(im.trunk);
    EXPECT_EQ(im.trunk->first_streamed(), 2);
    EXPECT_EQ(im.plan.ring.pinned, 2);
    EXPECT_NE(im.trunk_note.find("layers 0-1 pinned"), std::string::npos) << im.trunk_note;
    EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 8), run_session(res, ids, 8))) << dtype_name(dense);
    EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 8, 3), run_session(res, ids, 8, 3))) << dtype_name(dense);
    EXPECT_TRUE(bitwise_equal(run_batch(im.model, 2), run_batch(res, 2))) << dtype_name(dense);
    // Reads: only layers 2-4, once per call (layer 2 of the next call read ahead at its end).
    im.trunk->wait_idle();
    im.trunk->reset_stats();
    run_session(im.model, ids, 8);  // 1 + 4 calls
    im.trunk->wait_idle();
    uint64_t dev = 0;
    for (int64_t l = 2; l < 5; ++l) dev += im.trunk->layer_device_bytes(l);
    EXPECT_EQ(im.trunk->layer_device_bytes(0) + im.trunk->layer_device_bytes(1), 0u);
    EXPECT_EQ(im.plan.trunk_bytes_per_call, double(dev));
    const TrunkStats st = im.trunk->stats();
    EXPECT_EQ(st.acquires, 5 * 3);
    EXPECT_EQ(st.layer_reads, 5 * 3);
    EXPECT_EQ(st.device_bytes, 5 * dev);
  }
}

TEST(TrunkRing, ABudgetWithRoomForSomeLayersPinsThem) {
  const std::string dir = saved_model(DType::F32, 0, /*full=*/true).path;  // 13 layers
  const ModelDir md = open_model_dir(dir);
  const CheckpointReader ck = CheckpointReader::open(dir);
  uint64_t slot = 0, expert = 0;
  ExpertStreamer::measure(ck, md.config, &slot, &expert);
  const TrunkRingPlan ring = TrunkRing::measure(ck, md.config, false, 2);
  StreamOptions so;
  so.working_reserve_bytes = uint64_t(4) << 20;
  // Room for the ring, the minimum cache (2 top_k slots) and about three layers beside them.
  const uint64_t want_slots = uint64_t(2 * md.config.num_experts_per_token);
  const TrunkRingPlan three = ring.pinned_prefix(3);
  const uint64_t budget = three.held_bytes() + so.working_reserve_bytes + want_slots * slot + slot;
  ASSERT_LT(budget, ring.pinned_prefix(4).held_bytes() + so.working_reserve_bytes + want_slots * slot);
  InferenceModel im = load_inference_model(md, load_opts(budget, false), so, 1e9);
  ASSERT_TRUE(im.trunk);
  EXPECT_EQ(im.trunk->first_streamed(), 3);
  EXPECT_GE(im.stream->slots(), int64_t(want_slots));
  EXPECT_NE(stream_projection_line(im.plan).find("3 leading layers pinned"), std::string::npos)
      << stream_projection_line(im.plan);
  const K3Model res = load_model(dir);
  const std::vector<int32_t> ids = test::make_ids(8, im.model.dims().V, 8);
  EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 6), run_session(res, ids, 6)));
}
