// Decode sessions (infer/session.h): the logits of a prefill followed by N one-token decode
// steps equal the rows of one full forward over the same tokens (within 1e-4), for prompts
// and continuations that cross the KDA chunk length 64, on configs/tiny.json (block size 3)
// and with block sizes 2 and 1 (every layer a block boundary); prefill in several pieces;
// MXFP4 experts; the prefill and decode kernel variants agree; reset starts afresh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/fixture.h"
#include "common/random_model.h"
#include "infer/session.h"
#include "io/config.h"
#include "model/init.h"

using namespace k3;

namespace {

K3Config tiny(int64_t block_size = 0, int64_t expert_width = 0) { return test::tiny_config(block_size, expert_width); }
using test::make_ids;
using test::random_model;

std::vector<float> session_full_forward(const K3Model& m, const std::vector<int32_t>& ids) {
  std::vector<float> logits(ids.size() * size_t(m.dims().V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  m.forward(logits.data(), ids.data(), int64_t(ids.size()), st, s);
  return logits;
}

// Prefill pieces, then decode steps for the rest; every returned logits row against `full`.
void check_session(const K3Model& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& pieces,
                   const std::vector<float>& full, const std::string& tag, const SessionOptions& opt = {}) {
  const int64_t V = m.dims().V;
  Session s(m, opt);
  int64_t pos = 0;
  for (int64_t n : pieces) {
    const float* l = s.prefill(ids.data() + pos, n);
    pos += n;
    test::expect_close(l, full.data() + (pos - 1) * V, V, 1e-4, 0, tag + " prefill to " + std::to_string(pos));
  }
  for (; pos < int64_t(ids.size()); ++pos) {
    const float* l = s.step(ids[size_t(pos)]);
    test::expect_close(l, full.data() + pos * V, V, 1e-4, 0, tag + " step at " + std::to_string(pos));
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(s.position(), int64_t(ids.size()));
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

}  // namespace

TEST(Session, PrefillThenDecodeEqualsFullForward) {
  for (int64_t S : {3, 2, 1}) {
    const K3Model m = random_model(tiny(S), 20 + uint64_t(S));
    const std::string tag = "block size " + std::to_string(S);
    // Prompt across the chunk boundary, then a few steps.
    std::vector<int32_t> ids = make_ids(76, m.dims().V, 1);
    std::vector<float> full = session_full_forward(m, ids);
    ASSERT_GT(max_abs(full), 0.3);
    check_session(m, ids, {70}, full, tag + " P=70");
    // Short prompt (shorter than the conv kernel), decode across position 64.
    ids = make_ids(68, m.dims().V, 2);
    full = session_full_forward(m, ids);
    check_session(m, ids, {2}, full, tag + " P=2");
  }
}

TEST(Session, PrefillInPiecesContinuesTheSequence) {
  const K3Model m = random_model(tiny(), 31);
  const std::vector<int32_t> ids = make_ids(140, m.dims().V, 3);
  const std::vector<float> full = session_full_forward(m, ids);
  check_session(m, ids, {30, 40, 1, 64}, full, "pieces");
}

TEST(Session, Mxfp4ExpertsEqualFullForwardOfTheSameModel) {
  const K3Model m = random_model(tiny(0, 64), 41, ExpertStorage::Mxfp4);
  ASSERT_EQ(m.weights().expert_storage(), ExpertStorage::Mxfp4);
  const std::vector<int32_t> ids = make_ids(72, m.dims().V, 4);
  check_session(m, ids, {66}, session_full_forward(m, ids), "mxfp4");
}

TEST(Session, KernelVariantsAgree) {
  const K3Model m = random_model(tiny(2), 51);
  const std::vector<int32_t> ids = make_ids(70, m.dims().V, 5);
  const std::vector<float> full = session_full_forward(m, ids);
  SessionOptions ref;
  ref.prefill_path = KDAPath::Recurrent;
  ref.decode_path = KDAPath::Recurrent;
  check_session(m, ids, {65}, full, "reference kernels", ref);
  SessionOptions chunked;
  chunked.prefill_path = KDAPath::Chunked;
  chunked.reserve_tokens = 128;
  check_session(m, ids, {65}, full, "chunked prefill", chunked);
}

TEST(Session, ResetStartsAfresh) {
  const K3Model m = random_model(tiny(), 61);
  const std::vector<int32_t> ids = make_ids(10, m.dims().V, 6);
  Session s(m);
  const float* l1 = s.prefill(ids);
  const std::vector<float> a(l1, l1 + m.dims().V);
  const float* l2 = s.step(3);
  std::vector<float> b(l2, l2 + m.dims().V);
  s.reset();
  EXPECT_EQ(s.position(), 0);
  const float* l3 = s.prefill(ids);
  EXPECT_EQ(0, std::memcmp(l3, a.data(), a.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(s.step(3), b.data(), b.size() * sizeof(float)));
  EXPECT_THROW(s.prefill(ids.data(), 0), Error);
  EXPECT_THROW(s.step(int32_t(m.dims().V)), Error);
}
