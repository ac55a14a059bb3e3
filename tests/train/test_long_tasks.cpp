// Long-context tasks (train/long_tasks.h) and their scoring (train/long_eval.h): samples have
// the requested length in the model's vocabulary, the evidence sits where asked and holds the
// answer; the chunked, teacher-forced scoring agrees with the argmax of one full forward; loss
// by position equals the full forward's per-bucket loss; the decode state after a sample is
// exactly the formula's size; a length too short for the task is a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/random_model.h"
#include "core/error.h"
#include "long_task_bytes.h"
#include "train/long_eval.h"
#include "train/long_tasks.h"

using namespace k3;

namespace {

using k3::test::dec;
using k3::test::enc;

TEST(LongTasks, PasskeyHasItsLengthAndItsNeedleAtTheDepth) {
  for (double depth : {0.0, 0.5, 1.0}) {
    LongTaskOptions o;
    o.length = 1000;
    o.depth = depth;
    o.seed = 3;
    const LongSample s = make_long_sample(enc, o);
    EXPECT_EQ(int64_t(s.ids.size()), 1000);
    ASSERT_EQ(s.queries.size(), 1u);
    const LongQuery& q = s.queries[0];
    EXPECT_EQ(q.at + int64_t(q.answer.size()), 1000);
    const std::string text = dec(s.ids, 0, size_t(q.at));
    const std::string key = q.answer_text.substr(1);
    ASSERT_EQ(key.size(), 5u);
    const size_t needle = text.find("The pass key is " + key);
    ASSERT_NE(needle, std::string::npos);
    EXPECT_NEAR(double(needle) / double(text.size()), depth, 0.12) << "depth " << depth;
    EXPECT_NE(text.find("What is the pass key? The pass key is", needle), std::string::npos);
  }
  LongTaskOptions a, b;
  b.seed = 1;
  EXPECT_NE(make_long_sample(enc, a).queries[0].answer_text, make_long_sample(enc, b).queries[0].answer_text);
}

TEST(LongTasks, MqarAsksKeysWhoseValuesCameBefore) {
  LongTaskOptions o;
  o.task = LongTask::mqar;
  o.length = 1500;
  o.pairs = 10;
  o.queries = 4;
  const LongSample s = make_long_sample(enc, o);
  EXPECT_EQ(int64_t(s.ids.size()), 1500);
  ASSERT_EQ(s.queries.size(), 4u);
  for (const LongQuery& q : s.queries) {
    const std::string before = dec(s.ids, 0, size_t(q.at));
    const size_t colon = before.rfind(' ');  // " key:" just before the answer
    const std::string key = before.substr(colon + 1, before.size() - colon - 2);
    EXPECT_NE(before.find(" " + key + ":" + q.answer_text + "."), std::string::npos) << key;
  }
}

TEST(LongTasks, VartrackChainLeadsToTheValue) {
  LongTaskOptions o;
  o.task = LongTask::vartrack;
  o.length = 1200;
  o.pairs = 4;
  const LongSample s = make_long_sample(enc, o);
  EXPECT_EQ(int64_t(s.ids.size()), 1200);
  const std::string text = dec(s.ids, 0, size_t(s.queries[0].at));
  EXPECT_NE(text.find(" = " + s.queries[0].answer_text.substr(1) + "."), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '='), 5);
}

TEST(LongTasks, TooShortIsAClearError) {
  LongTaskOptions o;
  o.length = 40;
  try {
    make_long_sample(enc, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_long_task("needle"), Error);
}

std::vector<float> full_logits(const K3Model& m, const std::vector<int32_t>& ids) {
  std::vector<float> l(ids.size() * size_t(m.dims().V));
  DecodeState st = m.new_state();
  ForwardScratch s;
  m.forward(l.data(), ids.data(), int64_t(ids.size()), st, s);
  return l;
}

TEST(LongEval, ChunkedScoringAgreesWithTheFullForward) {
  const K3Model m = test::random_model(test::tiny_config(), 71);
  const int64_t V = m.dims().V;
  LongTaskOptions o;
  o.task = LongTask::mqar;
  o.length = 300;
  o.pairs = 6;
  o.queries = 6;
  const LongSample s = make_long_sample(enc, o);
  const std::vector<float> full = full_logits(m, s.ids);
  int64_t expect_correct = 0;
  double expect_nll = 0;
  for (const LongQuery& q : s.queries) {
    bool right = true;
    for (size_t i = 0; i < q.answer.size(); ++i) {
      const float* row = full.data() + (q.at - 1 + int64_t(i)) * V;
      right = right && int32_t(std::max_element(row, row + V) - row) == q.answer[i];
      double mx = *std::max_element(row, row + V), z = 0;
      for (int64_t j = 0; j < V; ++j) z += std::exp(double(row[j]) - mx);
      expect_nll += mx + std::log(z) - row[q.answer[i]];
    }
    expect_correct += right;
  }
  for (int64_t chunk : {64, 512}) {
    const LongScore r = score_long_sample(m, s, chunk);
    EXPECT_EQ(r.queries, 6);
    EXPECT_EQ(r.correct, expect_correct) << "chunk " << chunk;
    EXPECT_NEAR(r.answer_nll, expect_nll, 1e-3 * std::max(1.0, expect_nll)) << "chunk " << chunk;
    EXPECT_EQ(r.state_tokens, int64_t(s.ids.size()) - 1);  // all but the final "."
    EXPECT_EQ(r.state_bytes, decode_state_formula_bytes(m.dims(), r.state_tokens));
  }
}

TEST(LongEval, LossByPositionEqualsTheFullForward) {
  const K3Model m = test::random_model(test::tiny_config(), 72);
  const int64_t V = m.dims().V;
  const std::vector<int32_t> ids = test::make_ids(300, V, 73);
  const std::vector<float> full = full_logits(m, ids);
  const std::vector<double> got = loss_by_position(m, ids, 100, 64);
  ASSERT_EQ(got.size(), 3u);
  for (size_t b = 0; b < 3; ++b) {
    double sum = 0;
    int n = 0;
    for (size_t t = b * 100; t < std::min<size_t>((b + 1) * 100, 299); ++t, ++n) {
      const float* row = full.data() + t * size_t(V);
      double mx = *std::max_element(row, row + V), z = 0;
      for (int64_t j = 0; j < V; ++j) z += std::exp(double(row[j]) - mx);
      sum += mx + std::log(z) - row[ids[t + 1]];
    }
    EXPECT_NEAR(got[b], sum / n, 1e-4) << "bucket " << b;
  }
}

}  // namespace
