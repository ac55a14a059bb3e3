// Greedy speculative decoding (infer/speculative.h):
//  - the n-gram draft proposes what followed the latest earlier occurrence of the longest
//    recurring suffix, within its limits;
//  - a session's mark/rewind undoes a multi-token append exactly (KDA states and conv windows
//    bitwise, MLA caches truncated), so the logits after it equal those never disturbed;
//  - verify + keep_prefix(n) leaves the state a session has after appending those n tokens
//    alone (from the KDA step log on the Fast path; by re-appending on the Recurrent one);
//  - speculative generation emits exactly plain greedy's tokens (Session::step one at a time)
//    on random models and prompts made to repeat, with drafts both accepted and rejected,
//    in fewer passes than tokens; stopping on a drafted token stops there; bad options fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/random_model.h"
#include "core/error.h"
#include "infer/speculative.h"

using namespace k3;

namespace {

// configs/tiny.json cut to 4 layers (KDA, MLA, KDA, MLA): both mixers' rewind paths, quickly.
K3Config small_config() {
  K3Config c = test::tiny_config(2);
  c.num_hidden_layers = 4;
  c.full_attn_layers = {2, 4};
  c.kda_layers = {1, 3};
  return c;
}

std::vector<int32_t> plain_greedy(const K3Model& m, const std::vector<int32_t>& prompt, int64_t n,
                                  const SessionOptions& so = {}) {
  Session s(m, so);
  const float* l = s.prefill(prompt);
  std::vector<int32_t> out;
  while (int64_t(out.size()) < n) {
    out.push_back(greedy_token(l, m.dims().V));
    if (int64_t(out.size()) < n) l = s.step(out.back());
  }
  return out;
}

// A prompt that repeats a random phrase, so the draft has something to propose.
std::vector<int32_t> repeating_prompt(int64_t V, uint32_t seed) {
  const std::vector<int32_t> phrase = test::make_ids(7, V, seed);
  std::vector<int32_t> p;
  for (int r = 0; r < 4; ++r) p.insert(p.end(), phrase.begin(), phrase.end());
  return p;
}

}  // namespace

TEST(NgramDraft, ProposesWhatFollowedTheLatestOccurrenceOfTheLongestSuffix) {
  SpeculativeOptions o;
  o.draft_tokens = 3;
  o.ngram_max = 2;
  // suffix "5 6" occurred at 1 (followed by 7 8 9) and at 5 (followed by 1): latest wins.
  EXPECT_EQ(ngram_draft({4, 5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6}, o, 10), (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(ngram_draft({4, 5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6}, o, 2), (std::vector<int32_t>{1, 2}));
  // No 2-gram recurs; the 1-gram "6" does.
  EXPECT_EQ(ngram_draft({6, 1, 2, 3, 6}, o, 10), (std::vector<int32_t>{1, 2, 3}));
  o.ngram_min = 2;
  EXPECT_TRUE(ngram_draft({6, 1, 2, 3, 6}, o, 10).empty());
  EXPECT_TRUE(ngram_draft({1, 2, 3}, o, 10).empty());
  EXPECT_TRUE(ngram_draft({}, o, 10).empty());
  // A draft ends where the history ends.
  o.ngram_min = 1;
  EXPECT_EQ(ngram_draft({3, 3}, o, 10), (std::vector<int32_t>{3}));
  // A lookup corpus is searched after the history, for each suffix length in turn: "2 3"
  // occurs only there (its latest occurrence counts); "3" alone recurs in the history.
  o.lookup = {2, 3, 7, 2, 3, 8, 9};
  EXPECT_EQ(ngram_draft({5, 3, 6, 2, 3}, o, 10), (std::vector<int32_t>{8, 9}));
  o.ngram_max = 1;
  EXPECT_EQ(ngram_draft({5, 3, 6, 2, 3}, o, 10), (std::vector<int32_t>{6, 2, 3}));
  EXPECT_EQ(ngram_draft({9}, o, 10), std::vector<int32_t>{});  // at the corpus's end: nothing follows
  EXPECT_EQ(ngram_draft({8}, o, 10), (std::vector<int32_t>{9}));
}

TEST(SessionMark, RewindUndoesAMultiTokenAppendExactly) {
  const K3Model m = test::random_model(small_config(), 5);
  const int64_t V = m.dims().V;
  const std::vector<int32_t> prompt = test::make_ids(40, V, 3), more = test::make_ids(5, V, 4);
  Session a(m), b(m);
  a.prefill(prompt);
  b.prefill(prompt);
  a.mark();
  a.step_many(more.data(), 5);
  EXPECT_EQ(a.position(), 45);
  a.rewind();
  EXPECT_EQ(a.position(), 40);
  for (size_t i = 0; i < a.state().layers.size(); ++i) {
    const LayerState &x = a.state().layers[i], &y = b.state().layers[i];
    EXPECT_TRUE(x.kda.S == y.kda.S && x.kda.conv_q == y.kda.conv_q && x.kda.conv_k == y.kda.conv_k &&
                x.kda.conv_v == y.kda.conv_v)
        << "layer " << i;
    EXPECT_EQ(x.mla.n, y.mla.n);
    EXPECT_TRUE(x.mla.c_kv == y.mla.c_kv && x.mla.k_rope == y.mla.k_rope) << "layer " << i;
  }
  const float* la = a.step(more[0]);
  std::vector<float> ra(la, la + V);
  const float* lb = b.step(more[0]);
  EXPECT_EQ(0, std::memcmp(ra.data(), lb, sizeof(float) * size_t(V)));
  // step_many's rows: the last is logits().
  const float* rows = a.step_many(more.data() + 1, 3);
  EXPECT_EQ(0, std::memcmp(rows + 2 * V, a.logits(), sizeof(float) * size_t(V)));
}

// Bitwise equal decode states (KDA states and conv windows, MLA caches).
void expect_same_state(const Session& a, const Session& b, const std::string& what) {
  ASSERT_EQ(a.position(), b.position()) << what;
  for (size_t i = 0; i < a.state().layers.size(); ++i) {
    const LayerState &x = a.state().layers[i], &y = b.state().layers[i];
    EXPECT_TRUE(x.kda.S == y.kda.S && x.kda.conv_q == y.kda.conv_q && x.kda.conv_k == y.kda.conv_k &&
                x.kda.conv_v == y.kda.conv_v)
        << what << ", layer " << i;
    EXPECT_EQ(x.mla.n, y.mla.n) << what;
    EXPECT_TRUE(x.mla.c_kv == y.mla.c_kv && x.mla.k_rope == y.mla.k_rope) << what << ", layer " << i;
  }
}

TEST(SessionVerify, KeepPrefixEqualsAppendingThePrefixAlone) {
  const K3Model m = test::random_model(small_config(), 6);
  const int64_t V = m.dims().V;
  const std::vector<int32_t> prompt = test::make_ids(30, V, 5), feed = test::make_ids(5, V, 8);
  for (KDAPath path : {KDAPath::Fast, KDAPath::Recurrent}) {
    SessionOptions so;
    so.decode_path = path;
    for (int64_t n = 1; n <= 5; ++n) {
      const std::string what = std::string(path == KDAPath::Fast ? "Fast" : "Recurrent") + ", n " + std::to_string(n);
      Session a(m, so), b(m, so);
      a.prefill(prompt);
      b.prefill(prompt);
      const float* rows = a.verify(feed.data(), 5);
      std::vector<float> row_n(rows + (n - 1) * V, rows + n * V);
      const bool logged = a.keep_prefix(n);
      EXPECT_EQ(logged, path == KDAPath::Fast || n == 5) << what;
      b.step_many(feed.data(), n);
      expect_same_state(a, b, what);
      // logits() is the n-th token's; on the Fast path it is the verification's row.
      EXPECT_EQ(0, std::memcmp(a.logits(), b.logits(), sizeof(float) * size_t(V))) << what;
      if (path == KDAPath::Fast) {
        EXPECT_EQ(0, std::memcmp(row_n.data(), b.logits(), sizeof(float) * size_t(V))) << what;
      }
      // The sequences go on alike.
      const float* la = a.step(feed[0]);
      std::vector<float> ra(la, la + V);
      EXPECT_EQ(0, std::memcmp(ra.data(), b.step(feed[0]), sizeof(float) * size_t(V))) << what;
    }
  }
  // The RAM budget's reserve for speculation is what a verification of K + 1 tokens holds:
  // the step logs (K states per KDA layer) and the rows [K + 1, V].
  {
    Session s(m);
    s.prefill(prompt);
    s.verify(feed.data(), 5);
    uint64_t held = 5 * uint64_t(V) * 4;
    for (const LayerState& l : s.state().layers)
      held += 4 * (l.kda_log.S.size() + l.kda_log.conv_q.size() + l.kda_log.conv_k.size() + l.kda_log.conv_v.size());
    EXPECT_EQ(held, speculative_working_bytes(small_config(), 4));
    EXPECT_EQ(speculative_working_bytes(small_config(), 0), 0u);
  }
  Session s(m);
  s.prefill(prompt);
  EXPECT_THROW(s.keep_prefix(1), Error);  // no verify
  s.verify(feed.data(), 3);
  EXPECT_THROW(s.keep_prefix(4), Error);
  EXPECT_THROW(s.keep_prefix(0), Error);
}

TEST(Speculative, NgramDraftsEmitExactlyPlainGreedy) {
  for (uint64_t seed : {1, 2}) {
    const K3Model m = test::random_model(small_config(), seed);
    const std::vector<int32_t> prompt = repeating_prompt(m.dims().V, uint32_t(seed));
    const int64_t n = 24;
    const std::vector<int32_t> ref = plain_greedy(m, prompt, n);
    Session s(m);
    std::vector<int32_t> got;
    const SpeculativeStats st = generate_greedy_speculative(s, prompt, s.prefill(prompt), n, SpeculativeOptions{},
                                                            [&](int32_t t) {
                                                              got.push_back(t);
                                                              return true;
                                                            });
    EXPECT_EQ(got, ref) << "seed " << seed;
    EXPECT_EQ(st.tokens, n);
    EXPECT_GT(st.verifies, 0) << "the repeating prompt proposed no draft";
    EXPECT_EQ(s.position(), int64_t(prompt.size()) + n - 1);  // every token but the last appended
  }
}

// An oracle that knows plain greedy's continuation and proposes it, wrong from the
// (wrong_at)-th drafted token of every draft on: accepted prefixes and rejected tails.
// Fast decode path: rejected tails cut from the step log; Recurrent: by re-appending.
TEST(Speculative, OracleDraftsAcceptedAndRejectedGiveExactlyPlainGreedyInFewerPasses) {
  const K3Model m = test::random_model(small_config(), 3);
  const int64_t V = m.dims().V, n = 24;
  const std::vector<int32_t> prompt = test::make_ids(20, V, 9);
  const int64_t wrong_ats[3] = {0, 2, 99};
  for (int c = 0; c < 6; ++c) {
    const KDAPath path = c < 3 ? KDAPath::Fast : KDAPath::Recurrent;
    const int64_t wrong_at = wrong_ats[c % 3];
    SessionOptions so;
    so.decode_path = path;
    const std::vector<int32_t> ref = plain_greedy(m, prompt, n, so);
    const bool logged = path == KDAPath::Fast;
    std::vector<int64_t> lengths;  // of every draft proposed
    const Drafter oracle = [&](const std::vector<int32_t>& h, int64_t limit) {
      std::vector<int32_t> d;
      const size_t done = h.size() - prompt.size();  // tokens emitted so far
      for (int64_t j = 0; j < std::min<int64_t>(limit, 4) && done + size_t(j) < ref.size(); ++j)
        d.push_back(j >= wrong_at ? (ref[done + size_t(j)] + 1) % int32_t(V) : ref[done + size_t(j)]);
      if (!d.empty()) lengths.push_back(int64_t(d.size()));
      return d;
    };
    Session s(m, so);
    std::vector<int32_t> got;
    const SpeculativeStats st = generate_greedy_speculative(s, prompt, s.prefill(prompt), n, oracle, [&](int32_t t) {
      got.push_back(t);
      return true;
    });
    EXPECT_EQ(got, ref) << "wrong_at " << wrong_at;
    EXPECT_EQ(s.position(), int64_t(prompt.size()) + n - 1) << "wrong_at " << wrong_at;
    // Each draft keeps exactly its first wrong_at tokens; a longer one is cut (re-appended
    // without a step log).
    int64_t keep = 0, cut = 0, drafted = 0;
    for (int64_t len : lengths) keep += std::min(len, wrong_at), cut += len > wrong_at, drafted += len;
    EXPECT_EQ(st.verifies, int64_t(lengths.size()));
    EXPECT_EQ(st.drafted, drafted);
    EXPECT_EQ(st.accepted, keep) << "wrong_at " << wrong_at;
    EXPECT_EQ(st.cuts, cut) << "wrong_at " << wrong_at;
    EXPECT_EQ(st.reappends, logged ? 0 : cut) << "wrong_at " << wrong_at;
    EXPECT_EQ(st.passes, st.tokens - 1 - st.accepted + st.reappends);  // rounds (1 + kept tokens each) plus re-appends
    if (wrong_at == 99) {
      EXPECT_LE(st.passes, (n + 4) / 5 + 1);  // 5 tokens a pass
    }
    if (wrong_at > 0) {
      EXPECT_LT(st.passes, n - 1);
    }
    if (wrong_at == 2) {
      EXPECT_GT(cut, 0);
    }
  }
}

// Drafts from a lookup corpus: plain greedy's own continuation (every draft right), then the
// same with every third token wrong (drafts cut from the step log, none re-appended).
TEST(Speculative, LookupCorpusDraftsEmitExactlyPlainGreedy) {
  const K3Model m = test::random_model(small_config(), 4);
  const int64_t V = m.dims().V, n = 20;
  const std::vector<int32_t> prompt = test::make_ids(16, V, 11);
  const std::vector<int32_t> ref = plain_greedy(m, prompt, n);
  for (bool corrupt : {false, true}) {
    SpeculativeOptions o;
    o.ngram_min = 2;  // a 2-gram ending in a generated token is found in the corpus only
    o.lookup = ref;
    if (corrupt)
      for (size_t i = 2; i < o.lookup.size(); i += 3) o.lookup[i] = (o.lookup[i] + 1) % int32_t(V);
    Session s(m);
    std::vector<int32_t> got;
    const SpeculativeStats st = generate_greedy_speculative(s, prompt, s.prefill(prompt), n, o, [&](int32_t t) {
      got.push_back(t);
      return true;
    });
    EXPECT_EQ(got, ref) << "corrupt " << corrupt;
    EXPECT_EQ(st.reappends, 0);
    EXPECT_EQ(st.passes, st.tokens - 1 - st.accepted);
    if (!corrupt) {
      EXPECT_EQ(st.accepted, st.drafted);
      EXPECT_LE(st.passes, 1 + (n - 2 + 4) / 5);  // one plain step, then 5 tokens a pass
    } else {
      EXPECT_GT(st.cuts, 0);
      EXPECT_LT(st.accepted, st.drafted);
    }
  }
}

TEST(Speculative, StopsOnADraftedTokenAndRejectsBadOptions) {
  const K3Model m = test::random_model(small_config(), 2);
  const std::vector<int32_t> prompt = repeating_prompt(m.dims().V, 2);
  const std::vector<int32_t> ref = plain_greedy(m, prompt, 16);
  // Stop at the 12th token, whatever path produced it.
  Session s(m);
  std::vector<int32_t> got;
  generate_greedy_speculative(s, prompt, s.prefill(prompt), 16, SpeculativeOptions{}, [&](int32_t t) {
    if (got.size() == 11) return false;
    got.push_back(t);
    return true;
  });
  EXPECT_EQ(got, std::vector<int32_t>(ref.begin(), ref.begin() + 11));
  SpeculativeOptions bad;
  bad.ngram_min = 0;
  Session s2(m);
  EXPECT_THROW(generate_greedy_speculative(s2, prompt, s2.prefill(prompt), 5, bad, [](int32_t) { return true; }),
               Error);
  // draft_tokens 0 is plain greedy: one pass per token.
  SpeculativeOptions off;
  off.draft_tokens = 0;
  Session s3(m);
  got.clear();
  const SpeculativeStats st = generate_greedy_speculative(s3, prompt, s3.prefill(prompt), 16, off, [&](int32_t t) {
    got.push_back(t);
    return true;
  });
  EXPECT_EQ(got, ref);
  EXPECT_EQ(st.passes, 15);
  EXPECT_EQ(st.verifies, 0);
}
