// Greedy speculative decoding with an n-gram draft (see speculative.h).
#include "infer/speculative.h"

#include <algorithm>

#include "core/error.h"
#include "model/planner.h"

namespace k3 {

int32_t greedy_token(const float* logits, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

uint64_t speculative_working_bytes(const K3Config& c, int64_t draft_tokens) {
  if (draft_tokens <= 0) return 0;
  const uint64_t K = uint64_t(draft_tokens);
  return K * decode_cache_bytes(c, 1).kda_total + (K + 1) * uint64_t(c.vocab_size) * 4;
}

std::vector<int32_t> ngram_draft(const std::vector<int32_t>& h, const SpeculativeOptions& opt, int64_t limit) {
  const int64_t n_tok = int64_t(h.size());
  limit = std::min(limit, opt.draft_tokens);
  if (limit <= 0) return {};
  const std::vector<int32_t>& c = opt.lookup;
  const int64_t n_c = int64_t(c.size());
  for (int64_t n = std::min(opt.ngram_max, n_tok - (n_c > 0 ? 0 : 1)); n >= std::max<int64_t>(opt.ngram_min, 1); --n) {
    const int32_t* suffix = h.data() + (n_tok - n);
    // Latest earlier occurrence: start positions from the right, excluding the suffix itself.
    for (int64_t s = n_tok - n - 1; s >= 0; --s) {
      if (!std::equal(suffix, suffix + n, h.data() + s)) continue;
      const int64_t from = s + n, to = std::min(n_tok, from + limit);
      return std::vector<int32_t>(h.begin() + from, h.begin() + to);
    }
    // Then the corpus, where the suffix must be followed by something.
    for (int64_t s = n_c - n - 1; s >= 0; --s) {
      if (!std::equal(suffix, suffix + n, c.data() + s)) continue;
      const int64_t from = s + n, to = std::min(n_c, from + limit);
      return std::vector<int32_t>(c.begin() + from, c.begin() + to);
    }
  }
  return {};
}

SpeculativeStats generate_greedy_speculative(Session& session, std::vector<int32_t> history, const float* logits,
                                             int64_t max_tokens, const SpeculativeOptions& opt,
                                             const std::function<bool(int32_t)>& emit) {
  if (opt.draft_tokens < 0 || opt.ngram_min < 1 || opt.ngram_max < opt.ngram_min)
    fail("speculative decoding: needs draft_tokens >= 0 and 1 <= ngram_min <= ngram_max");
  const Drafter draft = [&opt](const std::vector<int32_t>& h, int64_t limit) { return ngram_draft(h, opt, limit); };
  return generate_greedy_speculative(session, std::move(history), logits, max_tokens, draft, emit);
}

SpeculativeStats generate_greedy_speculative(Session& session, std::vector<int32_t> history, const float* logits,
                                             int64_t max_tokens, const Drafter& drafter,
                                             const std::function<bool(int32_t)>& emit) {
  const int64_t V = session.vocab();
  SpeculativeStats st;
  int32_t next = greedy_token(logits, V);
  std::vector<int32_t> feed;
  while (st.tokens < max_tokens) {
    if (!emit(next)) break;
    ++st.tokens;
    history.push_back(next);
    if (st.tokens == max_tokens) break;
    // A draft never runs past max_tokens: the last emitted token needs no pass.
    std::vector<int32_t> draft = drafter(history, max_tokens - st.tokens - 1);
    if (int64_t(draft.size()) > max_tokens - st.tokens - 1) draft.resize(size_t(max_tokens - st.tokens - 1));
    if (draft.empty()) {
      next = greedy_token(session.step(next), V);
      ++st.passes;
      continue;
    }
    feed.assign(1, next);
    feed.insert(feed.end(), draft.begin(), draft.end());
    const float* rows = session.verify(feed.data(), int64_t(feed.size()));
    ++st.passes, ++st.verifies;
    st.drafted += int64_t(draft.size());
    // rows[j]: the model's distribution after feed[0..j]; draft[j] stands if it is its argmax.
    size_t keep = 0;
    while (keep < draft.size() && greedy_token(rows + int64_t(keep) * V, V) == draft[keep]) ++keep;
    st.accepted += int64_t(keep);
    int32_t after = greedy_token(rows + int64_t(keep) * V, V);
    if (keep < draft.size()) {
      // Undo the rejected tail: cut back to the kept tokens from the per-token states logged by
      // the verification, or (no log) rewind and append them again.
      ++st.cuts;
      if (!session.keep_prefix(int64_t(keep) + 1)) {
        after = greedy_token(session.logits(), V);
        ++st.passes, ++st.reappends;
      }
    }
    bool stopped = false;
    for (size_t j = 0; j < keep && !stopped; ++j) {
      if (!emit(draft[j])) {
        stopped = true;
        break;
      }
      ++st.tokens;
      history.push_back(draft[j]);
    }
    if (stopped) break;
    next = after;
  }
  return st;
}

}  // namespace k3
