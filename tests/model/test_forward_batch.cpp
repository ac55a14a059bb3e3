// Batched decode (K3Model::forward_batch, kda_mixer_forward_batch, mla_mixer_decode_batch):
// several sequences at different positions decoded in one call give, row for row, the logits
// each sequence gets from its own Decode forward (within 1e-5; the grouped MoE and the
// few-row linears may round differently with more rows), for one token per sequence and for
// segments of several tokens (against the full forward, 1e-4), with f32 and MXFP4 experts,
// and the states carry on so that later single-sequence calls still agree.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/fixture.h"
#include "common/random_model.h"
#include "core/error.h"

using namespace k3;

namespace {

std::vector<float> decode_one(const K3Model& m, DecodeState& st, ForwardScratch& s, int32_t id) {
  std::vector<float> l(size_t(m.dims().V));
  ForwardOptions fo;
  fo.mode = MixerMode::Decode;
  fo.last_only = true;
  m.forward(l.data(), &id, 1, st, s, fo);
  return l;
}

void prefill(const K3Model& m, DecodeState& st, ForwardScratch& s, const std::vector<int32_t>& ids) {
  std::vector<float> l(size_t(m.dims().V));
  ForwardOptions fo;
  fo.last_only = true;
  m.forward(l.data(), ids.data(), int64_t(ids.size()), st, s, fo);
}

void check_one_token_batches(const K3Model& m, const std::string& tag) {
  const int64_t V = m.dims().V;
  const std::vector<int64_t> prompt_len = {5, 70, 1, 33};
  const int64_t B = int64_t(prompt_len.size());
  std::vector<DecodeState> batch_states, own_states;
  std::vector<std::vector<int32_t>> ids;
  ForwardScratch s;
  for (int64_t j = 0; j < B; ++j) {
    ids.push_back(test::make_ids(prompt_len[size_t(j)] + 6, V, uint32_t(100 + j)));
    std::vector<int32_t> prompt(ids.back().begin(), ids.back().begin() + prompt_len[size_t(j)]);
    batch_states.push_back(m.new_state());
    own_states.push_back(m.new_state());
    prefill(m, batch_states.back(), s, prompt);
    prefill(m, own_states.back(), s, prompt);
  }
  std::vector<DecodeState*> ptr;
  for (auto& st : batch_states) ptr.push_back(&st);
  std::vector<int64_t> seg(size_t(B) + 1);
  for (int64_t j = 0; j <= B; ++j) seg[size_t(j)] = j;
  ForwardScratch bs;
  std::vector<float> logits(size_t(B * V));
  for (int64_t step = 0; step < 6; ++step) {
    std::vector<int32_t> step_ids;
    for (int64_t j = 0; j < B; ++j) step_ids.push_back(ids[size_t(j)][size_t(prompt_len[size_t(j)] + step)]);
    m.forward_batch(logits.data(), step_ids.data(), seg.data(), B, ptr.data(), bs);
    for (int64_t j = 0; j < B; ++j) {
      const std::vector<float> own = decode_one(m, own_states[size_t(j)], s, step_ids[size_t(j)]);
      test::expect_close(logits.data() + j * V, own.data(), V, 1e-5, 1e-5,
                         tag + " sequence " + std::to_string(j) + " step " + std::to_string(step));
      EXPECT_EQ(batch_states[size_t(j)].n_tokens, own_states[size_t(j)].n_tokens);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(ForwardBatch, OneTokenPerSequenceEqualsOwnDecode) {
  check_one_token_batches(test::random_model(test::tiny_config(), 41), "f32");
}

TEST(ForwardBatch, OneTokenPerSequenceEqualsOwnDecodeMxfp4) {
  check_one_token_batches(test::random_model(test::tiny_config(0, 64), 42, ExpertStorage::Mxfp4), "mxfp4");
}

TEST(ForwardBatch, SegmentsOfSeveralTokensEqualTheFullForward) {
  const K3Model m = test::random_model(test::tiny_config(), 43);
  const int64_t V = m.dims().V;
  // Three sequences: prompts of 9, 66 and 2 tokens, then one batched call appending 1, 4 and 3.
  const std::vector<int64_t> plen = {9, 66, 2}, add = {1, 4, 3};
  std::vector<std::vector<int32_t>> ids;
  std::vector<DecodeState> st;
  ForwardScratch s;
  for (size_t j = 0; j < plen.size(); ++j) {
    ids.push_back(test::make_ids(plen[j] + add[j], V, uint32_t(200 + j)));
    st.push_back(m.new_state());
    prefill(m, st.back(), s, std::vector<int32_t>(ids[j].begin(), ids[j].begin() + plen[j]));
  }
  std::vector<int32_t> rows;
  std::vector<int64_t> seg = {0};
  std::vector<DecodeState*> ptr;
  for (size_t j = 0; j < plen.size(); ++j) {
    rows.insert(rows.end(), ids[j].begin() + plen[j], ids[j].end());
    seg.push_back(seg.back() + add[j]);
    ptr.push_back(&st[j]);
  }
  std::vector<float> logits(rows.size() * size_t(V));
  m.forward_batch(logits.data(), rows.data(), seg.data(), int64_t(plen.size()), ptr.data(), s);
  for (size_t j = 0; j < plen.size(); ++j) {
    std::vector<float> full(ids[j].size() * size_t(V));
    DecodeState fresh = m.new_state();
    ForwardScratch fs;
    m.forward(full.data(), ids[j].data(), int64_t(ids[j].size()), fresh, fs);
    for (int64_t t = 0; t < add[j]; ++t)
      test::expect_close(logits.data() + (seg[j] + t) * V, full.data() + (plen[j] + t) * V, V, 1e-4, 0,
                         "sequence " + std::to_string(j) + " row " + std::to_string(t));
    EXPECT_EQ(st[j].n_tokens, plen[j] + add[j]);
  }
}

TEST(ForwardBatch, TokenOutsideTheVocabularyNamesItsRow) {
  const K3Model m = test::random_model(test::tiny_config(), 44);
  DecodeState a = m.new_state(), b = m.new_state();
  DecodeState* ptr[2] = {&a, &b};
  const int64_t seg[3] = {0, 1, 2};
  const int32_t ids[2] = {1, int32_t(m.dims().V)};
  std::vector<float> logits(size_t(2 * m.dims().V));
  ForwardScratch s;
  try {
    m.forward_batch(logits.data(), ids, seg, 2, ptr, s);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch row 1"), std::string::npos) << e.what();
  }
}

}  // namespace
