// The embedding and lm_head streamed (infer/head_stream.h) on a small MXFP4 model saved to a
// temp directory, the lm_head in blocks of 48 rows (6 blocks of a 256-token vocabulary, so two
// buffers re-read it every call): logits bitwise equal to the resident run with the same
// blocking for prefill (one row and 40 rows, the few-row and the sgemm products), decode steps
// and batched decode (f32 and bf16 checkpoints, bf16 used as stored and widened, O_DIRECT and
// buffered, with the trunk ring on as well); bytes read equal to the analytic count (the
// lm_head once per call, one embedding row window per token); an injected EIO and a short read
// on the lm_head and on the embedding give errors naming the file, the tensor and the offset,
// then the next call gives the resident logits; RssAnon growth under a budget that only fits
// with the head streamed; the engine choosing it by budget.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <string>
#include <vector>

#include "common/random_model.h"
#include "common/streamed_model.h"
#include "core/error.h"
#include "infer/mem_probe.h"
#include "infer/weight_stream.h"
#include "model/checkpoint.h"

using namespace k3;
using k3::test::bitwise_equal;
using k3::test::kBigBudget;
using k3::test::run_batch;
using k3::test::run_session;
using k3::test::saved_model;

namespace {

constexpr int64_t kBlockRows = 48;

StreamOptions head_opts(IoMode io = IoMode::Auto, int64_t trunk_slots = 0) {
  StreamOptions so;
  so.cache_slots = 3;
  so.io = io;
  so.working_reserve_bytes = uint64_t(4) << 20;
  so.stream_head = true;
  so.head_block_rows = kBlockRows;
  if (trunk_slots > 0) {
    so.stream_trunk = true;
    so.trunk_slots = trunk_slots;
  }
  return so;
}

InferenceModel streamed(const std::string& dir, const StreamOptions& so, bool as_stored = false,
                        uint64_t budget = kBigBudget) {
  LoadOptions lo;
  lo.dense_as_stored = as_stored;
  lo.ram_budget_bytes = budget;
  return load_inference_model(open_model_dir(dir), lo, so, 1e9);
}

// Every position's logits of one forward over T tokens (rows > 32: the sgemm product).
std::vector<float> full_forward(const K3Model& m, const std::vector<int32_t>& ids) {
  DecodeState st = m.new_state();
  ForwardScratch s;
  std::vector<float> out(ids.size() * size_t(m.dims().V));
  m.forward(out.data(), ids.data(), int64_t(ids.size()), st, s);
  return out;
}

struct Runs {
  std::vector<float> session, chunked, batch, full;
};

Runs run_all(const K3Model& m) {
  const std::vector<int32_t> ids = test::make_ids(12, 256, 5), long_ids = test::make_ids(40, 256, 9);
  return {run_session(m, ids, 8), run_session(m, ids, 8, 3), run_batch(m, 2), full_forward(m, long_ids)};
}

}  // namespace

TEST(HeadStream, LogitsBitwiseEqualResident) {
  struct Case {
    DType dense;
    bool as_stored;
    IoMode io;
    int64_t trunk_slots;
  };
  std::map<std::pair<int, bool>, Runs> wants;
  for (const Case& k : {Case{DType::F32, false, IoMode::Direct, 0}, Case{DType::F32, false, IoMode::Buffered, 2},
                        Case{DType::BF16, true, IoMode::Auto, 0}, Case{DType::BF16, true, IoMode::Buffered, 2},
                        Case{DType::BF16, false, IoMode::Direct, 0}}) {
    const std::string dir = saved_model(k.dense).path;
    Runs& want = wants[{int(k.dense), k.as_stored}];  // resident runs, once per model
    if (want.session.empty()) {
      LoadOptions lo;
      lo.dense_as_stored = k.as_stored;
      K3Model res = load_model(dir, lo);
      res.set_head_block_rows(kBlockRows);  // the same products, block by block
      want = run_all(res);
    }
    InferenceModel im = streamed(dir, head_opts(k.io, k.trunk_slots), k.as_stored);
    ASSERT_TRUE(im.head);
    ASSERT_EQ(im.head->blocks(), 6);
    EXPECT_EQ(bool(im.trunk), k.trunk_slots > 0);
    const std::string what = std::string(dtype_name(k.dense)) + " as_stored " + std::to_string(k.as_stored) + " " +
                             im.head->io_mode() + " trunk slots " + std::to_string(k.trunk_slots);
    const Runs got = run_all(im.model);
    EXPECT_TRUE(bitwise_equal(got.session, want.session)) << what;
    EXPECT_TRUE(bitwise_equal(got.chunked, want.chunked)) << "chunked, " << what;
    EXPECT_TRUE(bitwise_equal(got.batch, want.batch)) << "batch, " << what;
    EXPECT_TRUE(bitwise_equal(got.full, want.full)) << "40 rows, " << what;
    EXPECT_NE(im.head->io_mode().find(k.io == IoMode::Buffered ? "buffered" : "O_DIRECT"), std::string::npos);
    EXPECT_NE(im.trunk_note.find("embedding and lm_head streamed"), std::string::npos) << im.trunk_note;
    EXPECT_NE(stream_projection_line(im.plan).find("embedding and lm_head streamed"), std::string::npos);
  }
  // The default blocking of a small model is one block: the unblocked product as before.
  const K3Model res = load_model(saved_model(DType::F32).path);
  EXPECT_EQ(res.head_block_rows(), res.dims().V);
}

TEST(HeadStream, ReadsTheLmHeadOncePerCallAndOneRowPerToken) {
  for (auto [dense, elem] : {std::pair{DType::F32, 4}, std::pair{DType::BF16, 2}}) {
    const std::string dir = saved_model(dense).path;
    InferenceModel im = streamed(dir, head_opts(IoMode::Direct), dense == DType::BF16);
    const K3Config& c = im.model.config();
    const CheckpointReader ck = CheckpointReader::open(dir);
    const TensorInfo& emb = ck.info(kModelPrefix + "embed_tokens.weight");
    const uint64_t row = uint64_t(c.hidden_size) * uint64_t(elem);
    uint64_t dev = 0;
    for (int64_t b = 0; b < im.head->blocks(); ++b) dev += im.head->block_device_bytes(b);
    EXPECT_EQ(im.plan.head_bytes_per_call, double(dev));
    im.head->wait_idle();
    im.head->reset_stats();
    // 5 calls (a prefill of 5 tokens, 4 decode steps): the lm_head once per call (blocks 0 and
    // 1 of each call were read at the end of the one before, or at load).
    const std::vector<int32_t> ids = test::make_ids(9, c.vocab_size, 3);
    run_session(im.model, ids, 5);
    im.head->wait_idle();
    const int64_t K = 5, B = im.head->blocks();
    const HeadStats st = im.head->stats();
    EXPECT_EQ(st.block_acquires, K * B);
    EXPECT_EQ(st.block_reads, K * B);
    EXPECT_EQ(st.payload_bytes, uint64_t(K) * uint64_t(c.vocab_size) * row);
    EXPECT_EQ(st.device_bytes, uint64_t(K) * dev);
    EXPECT_LE(dev, uint64_t(c.vocab_size) * row + uint64_t(B) * 2 * 4096);  // widening only
    uint64_t windows = 0;  // each token's row, widened to 4096-byte boundaries
    for (int32_t id : ids) {
      const uint64_t s = emb.offset + uint64_t(id) * row;
      windows += (s + row + 4095) / 4096 * 4096 - s / 4096 * 4096;
    }
    EXPECT_EQ(st.embed_rows, int64_t(ids.size()));
    EXPECT_EQ(st.embed_device_bytes, windows);
  }
}

TEST(HeadStream, FailedAndShortReadsNameTheFileOffsetAndTensorThenTheNextCallWorks) {
  const std::string dir = saved_model(DType::BF16).path;
  LoadOptions lo;
  lo.dense_as_stored = true;
  K3Model res = load_model(dir, lo);
  res.set_head_block_rows(kBlockRows);
  const std::vector<int32_t> ids = test::make_ids(6, res.dims().V, 6);
  const std::vector<float> want = run_session(res, ids, 4);
  const CheckpointReader ck = CheckpointReader::open(dir);
  const TensorInfo& head = ck.info(kLmHeadName);
  const TensorInfo& emb = ck.info(kModelPrefix + "embed_tokens.weight");
  const uint64_t row = uint64_t(res.dims().d) * 2;
  struct Target {
    uint64_t at;       // a byte the fault covers
    const char* what;  // in the message
  };
  for (const Target& t : {Target{head.offset + (3 * kBlockRows + kBlockRows / 2) * row, "the lm_head rows 144 to 191"},
                          Target{emb.offset + uint64_t(ids[1]) * row + 8, "the embedding row of token"}}) {
    for (int mode : {1, 2}) {  // 1: EIO on every read covering the byte; 2: the read stops short of it
      std::atomic<int> armed{0};
      StreamOptions so = head_opts(IoMode::Direct);
      so.head_pread_hook = [&, mode](int fd, void* buf, size_t n, off_t off) -> ssize_t {
        const uint64_t o = uint64_t(off), T = t.at;
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
      InferenceModel im = streamed(dir, so, true);
      armed = 1;
      try {
        run_session(im.model, ids, 4);
        ADD_FAILURE() << "no error for fault mode " << mode << " at " << t.what;
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(mode == 1 ? "Input/output error" : "short read"), std::string::npos) << msg;
        EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
        EXPECT_NE(msg.find("at offset "), std::string::npos) << msg;
        EXPECT_NE(msg.find(t.what), std::string::npos) << msg;
        EXPECT_NE(msg.find(t.at >= head.offset ? "lm_head.weight" : "embed_tokens.weight"), std::string::npos) << msg;
      }
      armed = 0;
      EXPECT_TRUE(bitwise_equal(run_session(im.model, ids, 4), want)) << "after fault mode " << mode << ", " << t.what;
    }
  }
}

TEST(HeadStream, ChosenByBudgetWithRssAnonGrowthUnderIt) {
  // A vocabulary of 16384 x 128: the embedding and lm_head (16.8 MB in f32) outweigh the rest.
  test::TempDir tmp("k3_head");
  const std::string dir = tmp.sub("m");
  K3Config c = test::tiny_config(0, 256);
  c.vocab_size = 16384;
  {
    const K3Model m = test::random_model(c, 5, ExpertStorage::Mxfp4);
    SaveOptions so;
    so.experts = ExpertStorage::Mxfp4;
    save_checkpoint(dir, m.weights(), so);
  }
  StreamOptions so;
  so.tokens_per_call = 8;     // the working memory estimated for the calls below
  so.head_block_rows = 1024;  // 16 blocks of 512 KB
  // The minimum with the head streamed (forced) and the budget it then needs for 3 slots.
  const InferenceModel probe = streamed(dir, [&] {
    StreamOptions f = so;
    f.stream_head = true;
    f.cache_slots = 3;
    return f;
  }());
  ASSERT_TRUE(probe.head);
  const uint64_t budget = probe.plan.min_budget + probe.plan.slot_bytes;  // 3 slots
  ASSERT_GT(probe.plan.head.held_bytes, probe.plan.head.buffer_bytes + probe.plan.slot_bytes);
  // Held, the embedding and lm_head would not fit: the engine streams them by itself.
  const ProcMem before = read_proc_mem();
  MemSampler sampler(5);
  InferenceModel im = streamed(dir, so, false, budget);
  ASSERT_TRUE(im.head);
  EXPECT_FALSE(im.trunk);  // the layers stay resident: only the head is streamed
  EXPECT_EQ(im.stream->slots(), 3);
  EXPECT_LE(im.trunk_bytes + im.head->arena_bytes() + im.stream->arena_bytes(), budget + (uint64_t(4) << 20));
  const std::vector<int32_t> ids = test::make_ids(8, c.vocab_size, 8);
  const std::vector<float> got = run_session(im.model, ids, 6);
  sampler.stop();
  const int64_t growth = sampler.peak_anon() - before.rss_anon;
  EXPECT_LT(growth, int64_t(budget)) << "peak RssAnon grew " << growth << " bytes, budget " << budget;
  K3Model res = load_model(dir);
  res.set_head_block_rows(1024);
  EXPECT_TRUE(bitwise_equal(got, run_session(res, ids, 6)));
  // A budget with room for them held keeps them held.
  const InferenceModel roomy = streamed(dir, so, false, budget + probe.plan.head.held_bytes);
  EXPECT_FALSE(roomy.head);
}
