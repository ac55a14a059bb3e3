// Greedy speculative decoding with an n-gram draft (prompt lookup; Saxena 2023, the draft of
// llama.cpp's lookup decoding): the last n tokens of the text so far are looked up in it, and
// the tokens that followed their latest earlier occurrence are proposed as a draft. One
// decode-path forward over [the next token, draft...] gives the model's greedy choice after
// every draft prefix; the longest agreeing prefix is kept, plus the model's own token after
// it, so every emitted token is the model's greedy token. A rejected tail is undone exactly
// (Session::verify / keep_prefix): the KDA states after the kept tokens come back from the
// states the verification logged per token and the MLA caches are truncated; without a log (a
// decode path other than Fast) the session rewinds to a mark and appends the kept tokens
// again, one more pass. The win is fewer passes over the weights per token: under a RAM
// budget each pass reads the trunk and the union of the pass's experts once
// (infer/weight_stream.h); resident, the dense products run with several rows.
// Output equals plain greedy (Session::step one token at a time) up to float rounding: the
// verification pass computes the same function with the projections over several rows, so a
// near-tie between two logits could in principle break the other way (tests check equality).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "infer/session.h"

namespace k3 {

struct SpeculativeOptions {
  int64_t draft_tokens = 4;  // longest draft per pass (0: plain greedy)
  int64_t ngram_max = 3;     // longest suffix looked up
  int64_t ngram_min = 1;     // shortest suffix that may propose a draft
  // A static corpus of token ids the suffix is also looked up in, after the text so far
  // (`generate --lookup-ids`: a reference document; the benchmark's upper bound passes the
  // model's own greedy continuation, docs/memory-limited.md).
  std::vector<int32_t> lookup;
};

struct SpeculativeStats {
  int64_t tokens = 0;    // tokens emitted
  int64_t passes = 0;    // forwards after the prefill (steps, verifications, re-appends)
  int64_t verifies = 0;  // verification passes (a draft was proposed)
  int64_t drafted = 0, accepted = 0;
  int64_t cuts = 0;       // verifications with a rejected tail, cut back to the kept tokens
  int64_t reappends = 0;  // of those, cut by appending the kept tokens again (no step log)
  double acceptance() const { return drafted ? double(accepted) / double(drafted) : 0; }
};

// The draft after `history`: the tokens that followed the latest earlier occurrence of its
// last n tokens (n from ngram_max down to ngram_min, the first n that occurs in the history
// or else in opt.lookup, where its latest occurrence counts too), at most `limit` of them;
// empty if no suffix recurs.
std::vector<int32_t> ngram_draft(const std::vector<int32_t>& history, const SpeculativeOptions& opt, int64_t limit);

// Greedy generation after a prefill: `logits` are the session's logits of the last prompt
// token and `history` the prompt. emit(token) is called for every generated token in order
// and returns false to stop; at most max_tokens. The session ends holding every emitted
// token but the last (as after plain greedy steps); after a stop on a drafted token it also
// holds that token and the draft after it (verified in one pass): reset it before reuse.
SpeculativeStats generate_greedy_speculative(Session& session, std::vector<int32_t> history, const float* logits,
                                             int64_t max_tokens, const SpeculativeOptions& opt,
                                             const std::function<bool(int32_t)>& emit);

// The same with any drafter: draft(history, limit) proposes at most `limit` tokens to follow
// `history` (ngram_draft is the one above; tests use oracles that are partly wrong).
using Drafter = std::function<std::vector<int32_t>(const std::vector<int32_t>& history, int64_t limit)>;
SpeculativeStats generate_greedy_speculative(Session& session, std::vector<int32_t> history, const float* logits,
                                             int64_t max_tokens, const Drafter& draft,
                                             const std::function<bool(int32_t)>& emit);

// Memory a verification of up to K drafted tokens holds beyond plain decoding: the KDA step
// log (K states and conv windows per KDA layer) and the logits rows [K + 1, V]. Held back
// from a RAM budget (generate --speculate K --ram-budget GB).
uint64_t speculative_working_bytes(const K3Config& c, int64_t draft_tokens);

// Lowest index of the largest logit (the sampler's greedy rule).
int32_t greedy_token(const float* logits, int64_t V);

}  // namespace k3
